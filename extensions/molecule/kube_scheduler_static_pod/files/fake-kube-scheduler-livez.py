#!/usr/bin/env python3
"""Stand-in for kube-scheduler's /livez in the molecule container (no kubelet, no kube-scheduler there).

Healthy (200) while the static pod manifest's --config file exists and does not contain the text of the reject
file, the way kube-scheduler fails to start on a configuration it refuses; 500 otherwise. Serves 127.0.0.1 only.
The unit tests run it outside a container with their own paths (--manifest, --reject-file).
"""

import argparse
import re
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

PATHS = {"manifest": "/etc/kubernetes/manifests/kube-scheduler.yaml", "reject_file": "/etc/fake-kube-scheduler/reject"}


def read(path):
    try:
        with open(path, encoding="utf-8") as handle:
            return handle.read()
    except OSError:
        return None


def healthy():
    manifest = read(PATHS["manifest"])
    if manifest is None:
        return False
    config_flag = re.search(r"--config=(\S+)", manifest)
    if not config_flag:
        return True
    config = read(config_flag.group(1).strip("'\""))
    rejected = (read(PATHS["reject_file"]) or "").strip()
    return config is not None and not (rejected and rejected in config)


class LivezHandler(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/livez":
            status, body = 404, b"not found\n"
        elif healthy():
            status, body = 200, b"ok\n"
        else:
            status, body = 500, b"[-]config failed: kube-scheduler refused its configuration\n"
        self.send_response(status)
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, default=10259)
    parser.add_argument("--manifest", default=PATHS["manifest"])
    parser.add_argument("--reject-file", default=PATHS["reject_file"])
    options = parser.parse_args()
    PATHS.update(manifest=options.manifest, reject_file=options.reject_file)
    ThreadingHTTPServer(("127.0.0.1", options.port), LivezHandler).serve_forever()
