# gpuforge: JupyterLab listens on every interface inside the container (publish it on 127.0.0.1),
# needs the token from $JUPYTER_TOKEN for every request, and never runs as root.
c = get_config()  # noqa: F821  (provided by Jupyter when it loads this file)
c.ServerApp.ip = "0.0.0.0"
c.ServerApp.port = 8888
c.ServerApp.open_browser = False
c.ServerApp.allow_root = False
c.ServerApp.allow_remote_access = True
c.ServerApp.terminals_enabled = False
# No cross-origin use: Jupyter would echo the Origin of token-authenticated requests into
# Access-Control-Allow-Origin; a pattern no origin matches means a page elsewhere gets no CORS grant
# (its preflight fails, so it cannot send the token) and cookie requests from it are refused.
c.ServerApp.allow_origin_pat = r"^$"
