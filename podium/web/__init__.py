"""HTTP guards shared by the teacher's endpoint and ``podium front``: error answers and token auth.

Light (aiohttp and the rendezvous' token compare only): the front runs in a trainer's install,
which has neither torch nor Ray, and imports these from here rather than from the endpoint.
"""
