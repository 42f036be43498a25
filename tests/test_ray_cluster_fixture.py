"""The Ray test cluster (``fixtures.ray_cluster``) comes up where Ray has run before.

A plain ``ray.init()`` of Ray 2.60 (a trainer's, NeMo RL's, a user's) leaves a token in
``~/.ray/auth_token``; with it there ``ray start --head`` turns token auth on by itself, and a cluster
that left auth to Ray was refused to its own waiter. The fixture passes its own token explicitly, as
podium's launcher does. The cluster is started in a child process with a temporary ``HOME`` (Ray finds
the file through ``Path.home()``) holding a stale token, so the real home is untouched and this
session's own cluster and driver are not disturbed.
"""

from __future__ import annotations

import json
import os
import secrets
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.ray]

TESTS_DIR = Path(__file__).resolve().parent

# In the child: start the fixture's cluster (1 CPU per node), run a task on it, stop it, and say
# what it saw of the auth settings.
CHILD = """
import json, os, sys
from pathlib import Path
import ray
from fixtures.ray_cluster import start_test_cluster, stop_test_cluster

cluster, procs = start_test_cluster(1, Path(sys.argv[1]))
try:
    during = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")}
    token_mode = oct(os.stat(cluster.env["RAY_AUTH_TOKEN_PATH"]).st_mode & 0o777)
    ray.init(address=cluster.address, _node_ip_address=cluster.head_ip, log_to_driver=False)
    answer = ray.get(ray.remote(num_cpus=1)(lambda: 41 + 1).remote(), timeout=120)
    nodes = sum(1 for node in ray.nodes() if node["Alive"])
    ray.shutdown()
finally:
    stop_test_cluster(cluster, procs)
after = {k: os.environ.get(k) for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN_PATH", "RAY_AUTH_TOKEN")}
print("RESULT " + json.dumps({"answer": answer, "nodes": nodes, "env": cluster.env, "during": during,
                               "token_mode": token_mode, "after": after}))
"""


def test_cluster_starts_with_a_stale_home_token(tmp_path):
    home, logs = tmp_path / "home", tmp_path / "logs"
    logs.mkdir()
    (home / ".ray").mkdir(parents=True)
    stale = secrets.token_hex(32)  # what Ray 2.60's ray.init() writes there (generate_and_save_token)
    (home / ".ray" / "auth_token").write_text(stale)
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_AUTH")}
    env.update(HOME=str(home), RAY_AUTH_TOKEN="0" * 64,  # a user's own token in the shell: not the cluster's
               PYTHONPATH=os.pathsep.join(filter(None, [str(TESTS_DIR), env.get("PYTHONPATH")])))
    proc = subprocess.run([sys.executable, "-c", CHILD, str(logs)], env=env, capture_output=True,
                          text=True, timeout=400)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    line = next(x for x in proc.stdout.splitlines() if x.startswith("RESULT "))
    seen = json.loads(line.removeprefix("RESULT "))
    assert seen["answer"] == 42 and seen["nodes"] == 2, seen
    # its own token, passed explicitly to the nodes, this driver, and other drivers (cluster.env)
    token_path = seen["env"]["RAY_AUTH_TOKEN_PATH"]
    assert seen["env"]["RAY_AUTH_MODE"] == "token" and not token_path.startswith(str(home)), seen
    assert seen["during"] == {"RAY_AUTH_MODE": "token", "RAY_AUTH_TOKEN_PATH": token_path,
                              "RAY_AUTH_TOKEN": None}, seen
    assert seen["token_mode"] == "0o600", seen
    # the process's own settings back once the cluster is stopped; the token went with the temp dir
    assert seen["after"] == {"RAY_AUTH_MODE": None, "RAY_AUTH_TOKEN_PATH": None, "RAY_AUTH_TOKEN": "0" * 64}, seen
    assert not Path(token_path).exists()
    # the home's token is left as it was: Ray neither used nor replaced it
    assert (home / ".ray" / "auth_token").read_text() == stale
