"""Imported by every Python process of one node's first ``ray start`` under the fault
``slow_ray_agent_rank`` (:mod:`podium.faults`): Ray's dashboard agent waits before it starts, as a
starved node's does, and so misses the raylet's fixed wait for it; any other process goes on."""

import os
import sys
import time

from podium.faults import SLOW_AGENT_DELAY_ENV

if sys.argv and sys.argv[0].endswith(os.path.join("dashboard", "agent.py")):
    time.sleep(float(os.environ.get(SLOW_AGENT_DELAY_ENV, "0")))
