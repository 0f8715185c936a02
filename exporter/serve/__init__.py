"""The daemon's HTTP side: the aiohttp app (web.py), basic auth (auth.py), the listener's guard (listener.py), the status page (statuspage.py)."""
