"""Model building: which checkpoint, the TransformerConfig, megatron-core's GPT and hybrid models,
HF weights read slice by slice, Megatron torch_dist checkpoints and the conversion to them."""
