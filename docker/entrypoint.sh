#!/usr/bin/env bash
# Starts the course container's services on request:
#   jupyter  JupyterLab, token required (the default command)
#   ssh      sshd, public-key login only
#   all      sshd in the background, JupyterLab in the foreground
#   shell    an interactive bash
#   anything else is run as given, e.g. `python -m course doctor`
#
# Every path and port is an environment variable so the same script can be
# exercised outside a container, as an ordinary user, on a free loopback port.
set -euo pipefail

: "${JUPYTER_IP:=0.0.0.0}"
: "${JUPYTER_PORT:=8888}"
: "${JUPYTER_ROOT:=/workspace}"
: "${JUPYTER_CONFIG:=/etc/course/jupyter_server_config.py}"
: "${JUPYTER_BIN:=jupyter}"
: "${SSH_PORT:=22}"
: "${SSHD_CONFIG:=/etc/course/sshd_config}"
# sshd re-executes itself and therefore insists on an absolute path.
: "${SSHD_BIN:=/usr/sbin/sshd}"
# Host keys, the private copy of the login keys and the pid file live here.
# Mount a volume on it to keep the host keys across container re-creation.
: "${SSH_HOST_KEY_DIR:=/var/lib/course/ssh}"
# Where the services started here are recorded for the HEALTHCHECK.
: "${COURSE_RUN_DIR:=/tmp/course-run}"
# The course as shipped in the image, and the student's work folder (a volume).
: "${COURSE_DIST:=/opt/course}"
: "${COURSE_WORK:=/workspace}"

die() {
    echo "course-entrypoint: error: $*" >&2
    exit 1
}

# A restarted container keeps its /tmp; forget the previous start's services.
reset_services() {
    mkdir -p "$COURSE_RUN_DIR"
    rm -f "$COURSE_RUN_DIR/services"
}

record_service() {
    printf '%s %s %s\n' "$1" "$2" "$3" >>"$COURSE_RUN_DIR/services"
}

# The address a local probe should connect to for a server bound to "$1".
probe_address() {
    case "$1" in
        0.0.0.0 | "" | "*") echo 127.0.0.1 ;;
        ::) echo ::1 ;;
        *) echo "$1" ;;
    esac
}

find_authorized_keys() {
    if [ -n "${SSH_AUTHORIZED_KEYS:-}" ]; then
        echo "$SSH_AUTHORIZED_KEYS"
        return
    fi
    for candidate in /run/secrets/authorized_keys "${HOME:-/nonexistent}/.ssh/authorized_keys"; do
        if [ -f "$candidate" ]; then
            echo "$candidate"
            return
        fi
    done
}

# Checked before anything is generated, so a missing key costs nothing and
# leaves nothing behind.
check_ssh_keys() {
    keys=$(find_authorized_keys)
    if [ -z "$keys" ] || [ ! -f "$keys" ]; then
        die "no SSH public key: mount your authorized_keys read-only at /run/secrets/authorized_keys (or set SSH_AUTHORIZED_KEYS)"
    fi
    if ! grep -Eq '^[^#]*(ssh-|ecdsa-|sk-)' "$keys"; then
        die "$keys holds no public key; password login is disabled, so sshd would accept nobody"
    fi
}

prepare_ssh() {
    mkdir -p "$SSH_HOST_KEY_DIR"
    chmod 700 "$SSH_HOST_KEY_DIR"
    # Generated on first start rather than at build time: keys baked into an
    # image are shared by everyone who pulls it, so none of them would
    # identify this machine.
    for type in ed25519 rsa; do
        key="$SSH_HOST_KEY_DIR/ssh_host_${type}_key"
        if [ ! -f "$key" ]; then
            ssh-keygen -q -t "$type" -N '' -C "course-container-host" -f "$key"
        fi
    done
    # sshd's StrictModes rejects key files owned by another uid or writable
    # by others, which is what a bind mount from the host often looks like;
    # a private copy sidesteps that without loosening the check.
    install -m 600 "$keys" "$SSH_HOST_KEY_DIR/authorized_keys"
    sshd_args=(
        -D -e
        -f "$SSHD_CONFIG"
        -p "$SSH_PORT"
        -h "$SSH_HOST_KEY_DIR/ssh_host_ed25519_key"
        -h "$SSH_HOST_KEY_DIR/ssh_host_rsa_key"
        -o "AuthorizedKeysFile=$SSH_HOST_KEY_DIR/authorized_keys"
        -o "PidFile=$SSH_HOST_KEY_DIR/sshd.pid"
    )
}

prepare_jupyter() {
    # An explicitly empty token would switch authentication off; anyone who
    # can reach the port would get a shell.
    if [ -n "${JUPYTER_TOKEN+set}" ] && [ -z "$JUPYTER_TOKEN" ]; then
        die "JUPYTER_TOKEN is set but empty; unset it to get a random token, or give a non-empty one"
    fi
    if [ -z "${JUPYTER_TOKEN:-}" ]; then
        JUPYTER_TOKEN=$(python3 -c 'import secrets; print(secrets.token_urlsafe(32))')
        echo "Jupyter token generated for this start. Open (with the host port mapped to ${JUPYTER_PORT}):"
        echo "    http://127.0.0.1:${JUPYTER_PORT}/lab?token=${JUPYTER_TOKEN}"
    else
        echo "Jupyter uses the token from JUPYTER_TOKEN."
    fi
    # Jupyter reads the token from the environment, which keeps it out of
    # the process list.
    export JUPYTER_TOKEN
    jupyter_args=(
        lab
        --config="$JUPYTER_CONFIG"
        --ip="$JUPYTER_IP"
        --port="$JUPYTER_PORT"
        --ServerApp.port_retries=0
        --ServerApp.root_dir="$JUPYTER_ROOT"
        --no-browser
    )
}

# Copies into the work folder every file of the shipped course it lacks, and
# never overwrites one: a fresh volume gets the course, a student's edits stay.
seed_work() {
    [ -d "$COURSE_DIST" ] || return 0
    mkdir -p "$COURSE_WORK" 2>/dev/null || true
    if [ ! -w "$COURSE_WORK" ]; then
        die "the work folder $COURSE_WORK is not writable by uid $(id -u) (it belongs to uid $(stat -c %u "$COURSE_WORK" 2>/dev/null || echo '?')). Mount a named volume (-v course-work:$COURSE_WORK), or give the host folder to uid $(id -u): sudo chown -R $(id -u):$(id -g) FOLDER"
    fi
    python3 - "$COURSE_DIST" "$COURSE_WORK" <<'PY'
import os, shutil, sys
src, dst = sys.argv[1:3]
copied = 0
for folder, dirs, files in os.walk(src):
    dirs[:] = [d for d in dirs if d not in (".git", "__pycache__")]
    target = os.path.join(dst, os.path.relpath(folder, src))
    os.makedirs(target, exist_ok=True)
    for name in files:
        path = os.path.join(target, name)
        if not os.path.lexists(path):
            shutil.copy2(os.path.join(folder, name), path)
            copied += 1
if copied:
    print(f"course-entrypoint: copied {copied} course file(s) into {dst}; existing files kept")
PY
}

mode="${1:-jupyter}"
seed_work
case "$mode" in
    jupyter)
        reset_services
        prepare_jupyter
        record_service jupyter "$(probe_address "$JUPYTER_IP")" "$JUPYTER_PORT"
        exec "$JUPYTER_BIN" "${jupyter_args[@]}"
        ;;
    ssh)
        reset_services
        check_ssh_keys
        prepare_ssh
        record_service ssh "$(probe_address 0.0.0.0)" "$SSH_PORT"
        exec "$SSHD_BIN" "${sshd_args[@]}"
        ;;
    all)
        # Both checks first: a refusal must not leave half the services up.
        reset_services
        check_ssh_keys
        prepare_jupyter
        prepare_ssh
        "$SSHD_BIN" "${sshd_args[@]}" &
        record_service ssh "$(probe_address 0.0.0.0)" "$SSH_PORT"
        record_service jupyter "$(probe_address "$JUPYTER_IP")" "$JUPYTER_PORT"
        exec "$JUPYTER_BIN" "${jupyter_args[@]}"
        ;;
    shell)
        exec bash -l
        ;;
    *)
        exec "$@"
        ;;
esac
