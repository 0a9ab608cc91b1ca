import os

# Tests never reach the Hub; they build tiny models and data themselves.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_HUB_DISABLE_TELEMETRY", "1")

collect_ignore_glob = ["_upstream/*"]
