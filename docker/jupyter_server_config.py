"""JupyterLab settings for the course container.

The entrypoint passes the address, port and notebook folder on the command
line; what is set here are the choices that must hold however the server is
started.
"""

import os

c = get_config()  # noqa: F821  (provided by Jupyter when it loads this file)

# A server reachable through a published port must never run without a
# secret; refuse here too, for anyone who starts Jupyter without the
# entrypoint but with this file.
token = os.environ.get("JUPYTER_TOKEN", "")
if not token.strip():
    raise SystemExit("jupyter_server_config: JUPYTER_TOKEN is empty; refusing to run without auth")
c.IdentityProvider.token = token

c.ServerApp.open_browser = False
# Kernels inherit the server's user; a notebook should not be able to act as
# root on mounted volumes. Opt-in only, for test runs on a root-only machine.
c.ServerApp.allow_root = os.environ.get("JUPYTER_ALLOW_ROOT") == "1"
# Logins keep working across container restarts only through the token, not
# through a password someone set from the browser and forgot.
c.PasswordIdentityProvider.allow_password_change = False
