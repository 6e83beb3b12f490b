"""Run by tests/unit/test_forkserver.py in a child of the node launcher: report what it was given."""

import json
import os
import signal
import sys

print(json.dumps({"argv": sys.argv[1:], "env": os.environ.get("FORKCHILD_MARK"), "cwd": os.getcwd(),
                  "sid": os.getsid(0), "pid": os.getpid(),
                  "sigpipe_ignored": signal.getsignal(signal.SIGPIPE) == signal.SIG_IGN}))
sys.exit(int(sys.argv[1]))
