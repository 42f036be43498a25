"""The teacher's HTTP endpoint: its worker group served over the Open Inference Protocol (KServe v2).

It runs on the teacher's head node, serves and reports (URL, model metadata, queue, metrics); it
publishes nothing: the lifecycle (:mod:`podium.launcher.job.lifecycle`) sets its readiness and owns the
endpoint record. The wire codec is :mod:`podium.protocol.oip`, the batch rule
:mod:`podium.protocol.batch`.

=====  ==========================================  =====  ========================================
verb   route                                       auth   answer
=====  ==========================================  =====  ========================================
GET    /v2/health/live                             no     200 while the process serves HTTP
GET    /metrics                                    no*    Prometheus text (``podium.teacher.endpoint.metrics``)
GET    /v2/health/ready                            yes    200 once the owner says ready, 503 when
                                                          not ready (with the reason) or draining
GET    /v2                                         yes    server metadata (extensions)
GET    /v2/models/<name>[/versions/<v>]            yes    model metadata + podium's fields
GET    /v2/models/<name>[/versions/<v>]/ready      yes    like /v2/health/ready, for that model
POST   /v2/models/<name>[/versions/<v>]/infer      yes    logprobs (+ top-k) for input_ids and
                                                          input_lengths
=====  ==========================================  =====  ========================================

``*``: yes with ``podium.server.metrics_need_token``. ``<name>`` may be the teacher's served name
(its first alias), any of its aliases, or its key.
Every response carries ``X-Request-ID`` (the request's header or JSON ``id``, else a new one) and
``X-Podium-Generation`` (errors too: a client tells which generation answered).

The serving layer of a teacher (:mod:`podium.teacher`): it knows its group only through
:mod:`podium.teacher.seam`. Every module opens with what it owns.
"""

from podium.teacher.endpoint.config import EndpointConfig
from podium.teacher.endpoint.server import EndpointServer
from podium.teacher.endpoint.thread import ServerThread
from podium.web.errors import RequestError

__all__ = ["EndpointConfig", "EndpointServer", "RequestError", "ServerThread"]
