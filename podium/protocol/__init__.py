"""podium.protocol: what both sides of the wire share, below ``podium.client`` and ``podium.teacher``.

Neither of those packages imports the other; both import this one, which imports only numpy and
the standard library (and transformers lazily, for a tokenizer fingerprint).

- ``names``: tensor names, parameters, HTTP header names, routes, the server's name and version;
- ``oip``: the Open Inference Protocol (KServe v2) codec with the binary tensor extension;
- ``batch``: the one validation of a ``get_logprobs`` batch and its options;
- ``tokenizer``: the tokenizer fingerprint a teacher publishes and a trainer checks.
"""
