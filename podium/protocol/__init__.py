"""podium.protocol: what both sides of the wire share, below ``podium.client`` and ``podium.teacher``.

Neither of those packages imports the other; both import this one, which imports only numpy and
the standard library (and transformers lazily, for a tokenizer fingerprint): the wire's names, its
codec (the Open Inference Protocol with the binary tensor extension), the rows of a call
(:class:`~podium.protocol.batch.Batch`) and what it asks of them
(:class:`~podium.protocol.query.Query`), each checked by one rule on both sides, and the tokenizer
fingerprint a teacher publishes and a trainer checks.
"""
