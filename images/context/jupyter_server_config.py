# gpuforge: JupyterLab listens on every interface inside the container (publish it on 127.0.0.1),
# needs the token from $JUPYTER_TOKEN for every request, and never runs as root.
import os

c = get_config()  # noqa: F821  (provided by Jupyter when it loads this file)


def _has_ipv6() -> bool:
    """Whether the container has an IPv6 stack (an address on any interface; none when the kernel or the runtime
    turned IPv6 off, where binding :: would stop the server)."""
    try:
        with open("/proc/net/if_inet6") as f:
            return bool(f.read().strip())
    except OSError:
        return False


# "" binds IPv4 and IPv6 (two sockets), so an IPv6 network (docker network create --ipv6) reaches the server too
c.ServerApp.ip = "" if _has_ipv6() else "0.0.0.0"
c.ServerApp.port = 8888
c.ServerApp.open_browser = False
c.ServerApp.allow_root = False
c.ServerApp.allow_remote_access = True
c.ServerApp.terminals_enabled = False
# No cross-origin use: Jupyter would echo the Origin of token-authenticated requests into
# Access-Control-Allow-Origin; a pattern no origin matches means a page elsewhere gets no CORS grant
# (its preflight fails, so it cannot send the token) and cookie requests from it are refused.
c.ServerApp.allow_origin_pat = r"^$"

# HOME is the root dir (the entrypoint picks a writable HOME for arbitrary uids and read-only roots).
c.ServerApp.root_dir = os.environ.get("HOME") or "/tmp"
# Kubeflow serves the notebook under NB_PREFIX (checked by the entrypoint: a URL path).
if os.environ.get("NB_PREFIX"):
    c.ServerApp.base_url = os.environ["NB_PREFIX"].rstrip("/") + "/"
# No token only when asked for explicitly (GPUFORGE_JUPYTER_NO_TOKEN=1 or JUPYTER_TOKEN=""; the entrypoint says so).
if os.environ.get("GPUFORGE_JUPYTER_NO_TOKEN") == "1":
    c.IdentityProvider.token = ""
# No outbound calls: no news feed, no update check (the announcements plugin is off in labconfig/page_config.json).
c.LabApp.news_url = None
c.LabApp.check_for_updates_class = "jupyterlab.NeverCheckForUpdate"
c.LabApp.extension_manager = "readonly"  # the extension manager would query PyPI when opened
