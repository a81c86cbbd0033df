"""Publishing against a real pypiserver on loopback (--disable-fallback, auth for upload)."""

from __future__ import annotations

import contextlib
import hashlib
import io
import os
import shutil
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from packaging.utils import canonicalize_name

from sm120_build import cli
from sm120_build import publish as publish_module
from sm120_build.cache import sha256_of
from sm120_build.pins import Companion
from sm120_build.publish import LocalWheel, local_wheels, write_static_index

from .conftest import (
    REPO,
    free_port,
    installed_versions,
    small_wheel,
    wheel_in,
    wheelhouse_project,
)

PASSWORD = "correct-horse-battery-4711"


@pytest.fixture
def index(tmp_path: Path, request: pytest.FixtureRequest) -> Any:
    """pypiserver started and stopped by process id; uploads need uploader:PASSWORD, and so
    does reading when the test is marked `private_index`."""
    from passlib.apache import HtpasswdFile

    authenticate = (
        "update,download,list" if request.node.get_closest_marker("private_index") else "update"
    )

    packages = tmp_path / "served"
    packages.mkdir()
    htpasswd = HtpasswdFile(str(tmp_path / "htpasswd"), new=True)
    htpasswd.set_password("uploader", PASSWORD)
    htpasswd.save()
    port = free_port()
    log = (tmp_path / "server.log").open("w")
    server = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "pypiserver",
            "run",
            "--interface",
            "127.0.0.1",
            "--port",
            str(port),
            "--disable-fallback",
            "--hash-algo",
            "sha256",
            "--passwords",
            str(tmp_path / "htpasswd"),
            "--authenticate",
            authenticate,
            str(packages),
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    base = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 30
    while True:
        try:
            urllib.request.urlopen(f"{base}/simple/", timeout=2).close()
            break
        except urllib.error.HTTPError:  # up, and asking for credentials
            break
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                server.kill()
                pytest.fail("pypiserver did not start: " + (tmp_path / "server.log").read_text())
            time.sleep(0.2)
    yield SimpleNamespace(upload=f"{base}/", simple=f"{base}/simple/", packages=packages)
    server.terminate()
    server.wait(timeout=10)
    log.close()


def publish(
    root: Path,
    *args: str,
    password: str = PASSWORD,
    find_links: Path | None = None,
    env_credentials: bool = True,
) -> SimpleNamespace:
    """`sm120-build publish ARGS` run from `root`, in this process (so that mutation testing
    sees which tests reach publish.py), with returncode, stdout and stderr as a subprocess's.
    Its environment and working directory are restored afterwards."""
    saved_environ, saved_cwd = dict(os.environ), Path.cwd()
    # No ~/.pypirc or keyring of the machine's.
    os.environ.update(HOME=str(root))
    for variable in ("TWINE_USERNAME", "TWINE_PASSWORD", "TWINE_REPOSITORY_URL"):
        os.environ.pop(variable, None)
    if env_credentials:
        os.environ.update(TWINE_USERNAME="uploader", TWINE_PASSWORD=password)
    os.environ.pop("PIP_FIND_LINKS", None)
    if find_links is not None:  # pip's own configuration, as the build machine has it
        os.environ.update(PIP_FIND_LINKS=str(find_links), PIP_NO_INDEX="1")
    stdout, stderr = io.StringIO(), io.StringIO()
    try:
        os.chdir(root)
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr):
            try:
                returncode: object = cli.main(["publish", *args])
            except SystemExit as exit:  # argparse's refusals
                returncode = exit.code
    finally:
        os.chdir(saved_cwd)
        os.environ.clear()
        os.environ.update(saved_environ)
    return SimpleNamespace(
        returncode=returncode, stdout=stdout.getvalue(), stderr=stderr.getvalue()
    )


def hash_checked_install(
    python: Path, requirements: Path, *sources: str
) -> subprocess.CompletedProcess[str]:
    """The node's install: pip --require-hashes --no-deps -r REQUIREMENTS from `sources`
    alone (no pip configuration of this machine's)."""
    env = {
        "PATH": os.environ["PATH"],
        "HOME": str(requirements.parent),
        "PIP_CONFIG_FILE": os.devnull,
        # A node's pip cache is not under test, and for the fresh-node closure it would hold
        # a second copy of its gigabytes on CI's disk beside the venv.
        "PIP_NO_CACHE_DIR": "1",
    }
    pip = [str(python), "-m", "pip", "install", "--quiet", "--require-hashes", "--no-deps"]
    return subprocess.run(
        [*pip, *sources, "-r", str(requirements)],
        env=env,
        capture_output=True,
        text=True,
    )


def fresh_install(root: Path, index_url: str, tmp_path: Path) -> dict[str, str]:
    """The node's install of wheelhouse/requirements.txt from index_url into a fresh venv;
    returns what got installed."""
    return _fresh_install(root / "wheelhouse/requirements.txt", index_url, tmp_path)


def fresh_install_from(requirements: Path, static: Path, tmp_path: Path) -> dict[str, str]:
    """The same from a static tree alone: its simple/ index and a lock file in it."""
    return _fresh_install(requirements, (static / "simple").as_uri() + "/", tmp_path)


def _fresh_install(requirements: Path, index_url: str, tmp_path: Path) -> dict[str, str]:
    venv = tmp_path / "node-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installed = hash_checked_install(venv / "bin/python", requirements, "--index-url", index_url)
    assert installed.returncode == 0, installed.stderr
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull}
    return installed_versions(venv / "bin/python", env)


def required_versions(root: Path) -> dict[str, str]:
    lines = (root / "wheelhouse/requirements.txt").read_text().splitlines()
    return {
        canonicalize_name(name): version
        for name, version in (line.split(" ")[0].split("==") for line in lines if "==" in line)
    }


def test_upload_then_install_then_republish_is_a_no_op(
    project: Path, index: Any, tmp_path: Any
) -> None:
    first = publish(project, "--repository-url", index.upload, "--index-url", index.simple)
    assert first.returncode == 0, first.stderr
    assert sorted(p.name for p in index.packages.iterdir()) == sorted(
        p.name for p in (project / "wheelhouse").glob("*.whl")
    )
    assert first.stderr.count(": uploaded") == 2
    for number, name in enumerate(sorted(p.name for p in index.packages.iterdir()), 1):
        assert f"sm120-build: uploading {name} ({number} of 2)\n" in first.stderr

    installed = fresh_install(project, index.simple, tmp_path)
    for name, version in required_versions(project).items():
        assert installed[name] == version

    again = publish(project, "--repository-url", index.upload, "--index-url", index.simple)
    assert again.returncode == 0, again.stderr
    for name in (p.name for p in index.packages.iterdir()):
        assert f"sm120-build:   {name}: already there (identical), skipped\n" in again.stderr
    assert "uploading" not in again.stderr


def test_the_companion_in_the_wheelhouse_is_published_too(tmp_path: Path, index: Any) -> None:
    """requirements.txt pins flashinfer-cubin beside our wheels, and the build puts its file
    in the wheelhouse: an index that does not proxy the public one must serve it too, or
    the node's install fails on it."""
    links = tmp_path / "links"
    companion = wheel_in(links, "gamma_pkg", "3.0")
    scratch = tmp_path / "scratch"
    scratch.mkdir()
    real = hashlib.sha256((links / companion.name).read_bytes()).hexdigest()
    pin = Companion("gamma-pkg", "3.0", ("0" * 64, real))  # pip takes a file of either hash
    root = wheelhouse_project(
        tmp_path / "project-with-companion",
        [small_wheel(scratch, "alpha_pkg", "1.0")],
        [pin],
        [companion],
    )
    env_result = publish(root, "--repository-url", index.upload, "--index-url", index.simple)
    assert env_result.returncode == 0, env_result.stderr
    assert sorted(p.name for p in index.packages.iterdir()) == sorted(
        p.name for p in (root / "wheelhouse").glob("*.whl")
    )
    assert companion.name in {p.name for p in index.packages.iterdir()}
    installed = fresh_install(root, index.simple, tmp_path)
    assert installed["gamma-pkg"] == "3.0"
    static = publish(root, "--static", str(tmp_path / "static"))
    assert static.returncode == 0, static.stderr
    assert (tmp_path / "static" / "packages" / companion.name).is_file()
    again = publish(root, "--repository-url", index.upload, "--index-url", index.simple)
    assert again.returncode == 0 and again.stderr.count("already there (identical)") == 2


def test_a_wheelhouse_without_its_companions_wheel_is_refused(tmp_path: Path, index: Any) -> None:
    """A wheelhouse built before the build fetched companions: requirements.txt pins
    gamma, no gamma wheel is there. Publishing it would leave the node's install short."""
    (tmp_path / "scratch").mkdir()
    root = wheelhouse_project(
        tmp_path / "project",
        [small_wheel(tmp_path / "scratch", "alpha_pkg", "1.0")],
        [Companion("gamma-pkg", "3.0", ("0" * 64,))],
    )
    for extra in ((), ("--static", str(tmp_path / "static"))):
        args = extra or ("--repository-url", index.upload, "--index-url", index.simple)
        result = publish(root, *args)
        assert result.returncode == 1
        assert (
            f"{root / 'wheelhouse'} holds no wheel of gamma-pkg, which requirements.txt pins"
            in result.stderr
        )
    assert list(index.packages.iterdir()) == []
    assert not (tmp_path / "static").exists()


def test_an_index_url_that_does_not_serve_the_upload_fails_the_read_back(
    project: Path, index: Any, tmp_path: Path
) -> None:
    """--index-url naming another index than the one uploaded to (an empty static tree
    here): the uploads succeed, and the read-back says what is missing where."""
    elsewhere = tmp_path / "elsewhere" / "simple"
    elsewhere.mkdir(parents=True)
    other_index = elsewhere.as_uri() + "/"
    result = publish(project, "--repository-url", index.upload, "--index-url", other_index)
    assert result.returncode == 1
    (alpha,) = (project / "wheelhouse").glob("alpha_pkg-*.whl")
    digest = hashlib.sha256(alpha.read_bytes()).hexdigest()
    assert (
        f"error: after uploading, {other_index} serves {alpha.name} with sha256 nothing, "
        f"not {digest}\n"
    ) in result.stderr
    assert f"sm120-build: summary for {other_index}:\n" in result.stderr
    assert result.stderr.count(": uploaded") == 2


def test_same_name_other_content_is_refused(project: Path, index: Any, tmp_path: Path) -> None:
    wheelhouse = project / "wheelhouse"
    (tampered,) = wheelhouse.glob("alpha_pkg-*.whl")
    other = small_wheel(tmp_path, "alpha_pkg", "1.0+sm120.pabc12345", payload="changed = 1\n")
    shutil.copyfile(other, index.packages / tampered.name)  # the index already has a variant
    result = publish(project, "--repository-url", index.upload, "--index-url", index.simple)
    assert result.returncode == 1
    assert tampered.name in result.stderr and "other content" in result.stderr

    assert hashlib.sha256(other.read_bytes()).hexdigest() in result.stderr
    assert hashlib.sha256(tampered.read_bytes()).hexdigest() in result.stderr
    # alpha_pkg sorts first: nothing after it was uploaded, and the summary says so.
    assert not list(index.packages.glob("beta_pkg-*"))
    assert "beta_pkg-2.0-py3-none-any.whl: NOT on the index" in result.stderr
    other_sha = hashlib.sha256(other.read_bytes()).hexdigest()
    assert f"{tampered.name}: on the index with OTHER content (sha256 {other_sha})" in (
        result.stderr
    )


def test_a_conflict_on_the_last_file_stops_the_run_before_any_upload(
    project: Path, index: Any, tmp_path: Path
) -> None:
    """beta_pkg sorts last: alpha_pkg, which the index lacks, must not be uploaded either."""
    (tampered,) = (project / "wheelhouse").glob("beta_pkg-*.whl")
    other = small_wheel(tmp_path, "beta_pkg", "2.0", payload="changed = 1\n")
    shutil.copyfile(other, index.packages / tampered.name)
    result = publish(project, "--repository-url", index.upload, "--index-url", index.simple)
    assert result.returncode == 1
    assert "Indexes do not allow replacing a file; nothing was uploaded.\n" in result.stderr
    assert not list(index.packages.glob("alpha_pkg-*"))
    assert "alpha_pkg-1.0+sm120.pabc12345-py3-none-any.whl: NOT on the index" in result.stderr


def test_wrong_password_is_a_clear_auth_error_and_uploads_nothing(
    project: Path, index: Any
) -> None:
    result = publish(
        project,
        "--repository-url",
        index.upload,
        "--index-url",
        index.simple,
        password="wrong-password-0000",
    )
    assert result.returncode == 1
    assert "rejected the credentials" in result.stderr
    assert list(index.packages.iterdir()) == []
    assert "NOT on the index" in result.stderr


def test_server_not_running_is_a_clear_connection_error(project: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/"
    result = publish(project, "--repository-url", url, "--index-url", url + "simple/")
    assert result.returncode == 1
    assert f"from http://127.0.0.1:{url.split(':')[2].rstrip('/')}" in result.stderr
    assert "Connection refused" in result.stderr
    assert "Traceback" not in result.stderr


@pytest.mark.private_index
def test_read_back_from_an_index_that_needs_auth_authenticates_like_twine(
    project: Path, index: Any
) -> None:
    anonymous = urllib.request.Request(index.simple + "alpha-pkg/")
    with pytest.raises(urllib.error.HTTPError, match="401"):
        urllib.request.urlopen(anonymous, timeout=10)
    result = publish(project, "--repository-url", index.upload, "--index-url", index.simple)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(": uploaded") == 2


def test_silent_server_times_out_and_is_named(project: Path, index: Any) -> None:
    """A server that accepts the connection and never answers."""
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        url = f"http://127.0.0.1:{silent.getsockname()[1]}/"
        started = time.monotonic()
        result = publish(
            project, "--repository-url", url, "--index-url", index.simple, "--timeout", "3"
        )
        elapsed = time.monotonic() - started
    assert result.returncode == 1
    assert f"to {url.rstrip('/')} got no answer within 3 s" in result.stderr
    assert elapsed < 60
    assert "Traceback" not in result.stderr


def test_credentials_in_a_url_are_refused(project: Path, index: Any) -> None:
    url = index.upload.replace("http://", f"http://uploader:{PASSWORD}@")
    result = publish(project, "--repository-url", url, "--index-url", index.simple)
    assert result.returncode == 1
    assert "error: --repository-url carries credentials in the URL" in result.stderr
    assert PASSWORD not in result.stderr
    assert list(index.packages.iterdir()) == []
    url = index.simple.replace("http://", f"http://uploader:{PASSWORD}@")
    result = publish(project, "--repository-url", index.upload, "--index-url", url)
    assert "error: --index-url carries credentials in the URL" in result.stderr
    assert PASSWORD not in result.stderr


@pytest.mark.parametrize("option", ["--index-url", "--repository-url"])
def test_a_url_that_is_not_http_is_refused_by_its_option(
    project: Path, index: Any, option: str
) -> None:
    urls = {"--index-url": index.simple, "--repository-url": index.upload, option: "ftp://x/"}
    result = publish(project, *(part for pair in urls.items() for part in pair))
    assert result.returncode == 1
    assert f"error: {option} 'ftp://x/' is not an http(s) URL\n" in result.stderr
    assert list(index.packages.iterdir()) == []


def test_a_wheel_twine_check_rejects_stops_the_run_with_twines_words(
    tmp_path: Path, index: Any
) -> None:
    """Whatever the terminal's width and the path's length: twine's console cut long paths
    at the terminal's width, and with them the wheel's name."""
    broken_rst = ("text/x-rst", ".. broken:: directive\n\n`unclosed\n")  # does not render
    deep = tmp_path / ("a-rather-long-directory-name-" * 6)
    deep.mkdir()
    wheel = small_wheel(deep, "delta_pkg", "1.0", description=broken_rst)
    root = wheelhouse_project(deep / "project", [wheel])
    os.environ["COLUMNS"] = "40"
    try:
        result = publish(root, "--repository-url", index.upload, "--index-url", index.simple)
    finally:
        del os.environ["COLUMNS"]
    assert result.returncode == 1
    assert result.stderr.startswith(
        "error: twine check failed for delta_pkg-1.0-py3-none-any.whl; nothing was uploaded. "
        "twine said:\n"
    )
    assert f"{root / 'wheelhouse' / 'delta_pkg-1.0-py3-none-any.whl'}: FAILED" in result.stderr
    assert list(index.packages.iterdir()) == []


@pytest.mark.private_index
def test_a_repository_named_in_pypirc_is_uploaded_to_and_read_back_with_its_credentials(
    project: Path, index: Any
) -> None:
    """--repository NAME instead of a URL: twine uploads to the ~/.pypirc section, and the
    read-back of an index that needs auth for reading uses that section's credentials."""
    (project / ".pypirc").write_text(
        "[distutils]\nindex-servers =\n    internal\n\n"
        f"[internal]\nrepository = {index.upload}\nusername = uploader\npassword = {PASSWORD}\n"
    )
    result = publish(
        project, "--repository", "internal", "--index-url", index.simple, env_credentials=False
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(": uploaded") == 2
    assert len(list(index.packages.iterdir())) == 2
    wrong = publish(
        project, "--repository", "elsewhere", "--index-url", index.simple, env_credentials=False
    )
    assert wrong.returncode == 1
    assert "uploading" not in wrong.stderr  # the read-back of a private index fails first


def test_a_failed_upload_to_a_named_repository_names_it(
    project: Path, index: Any, tmp_path: Path
) -> None:
    (project / ".pypirc").write_text(
        "[distutils]\nindex-servers =\n    internal\n\n"
        f"[internal]\nrepository = {index.upload}\nusername = uploader\npassword = wrong\n"
    )
    result = publish(
        project, "--repository", "internal", "--index-url", index.simple, env_credentials=False
    )
    assert result.returncode == 1
    (alpha,) = (project / "wheelhouse").glob("alpha_pkg-*.whl")
    assert (
        f"error: uploading {alpha.name} to repository internal failed: the index rejected "
        "the credentials or their rights (HTTP 403 Forbidden)"
    ) in result.stderr


def test_no_credentials_at_all_fail_at_once_instead_of_prompting(project: Path, index: Any) -> None:
    """twine runs --non-interactive: with no credentials anywhere it stops and says so."""
    args = ("--repository-url", index.upload, "--index-url", index.simple)
    result = publish(project, *args, env_credentials=False)
    assert result.returncode == 1
    assert "Credential not found for username" in result.stderr
    assert list(index.packages.iterdir()) == []


def test_publish_as_a_library_takes_extra_files_once(
    project: Path, index: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """publish() and write_static_index() called directly: without a closure, and with
    closure files, one of which is already among ours (it is not uploaded twice)."""
    monkeypatch.setenv("TWINE_USERNAME", "uploader")
    monkeypatch.setenv("TWINE_PASSWORD", PASSWORD)
    monkeypatch.setenv("HOME", str(project))
    wheelhouse = project / "wheelhouse"
    ours = local_wheels(wheelhouse)
    extra = small_wheel(tmp_path, "epsilon_pkg", "5.0")
    closure = [ours[0], LocalWheel(extra, "epsilon-pkg", sha256_of(extra))]
    publish_module.publish(wheelhouse, index.upload, None, index.simple)
    assert len(list(index.packages.iterdir())) == 2
    publish_module.publish(wheelhouse, index.upload, None, index.simple, closure=closure)
    assert sorted(p.name for p in index.packages.iterdir()) == sorted(
        [extra.name, *(w.path.name for w in ours)]
    )
    static = tmp_path / "static"
    write_static_index(wheelhouse, static, closure)
    assert sorted(p.name for p in (static / "packages").iterdir()) == sorted(
        [extra.name, *(w.path.name for w in ours)]
    )


def test_a_wheelhouse_without_requirements_txt_is_refused(project: Path, tmp_path: Path) -> None:
    (project / "wheelhouse" / "requirements.txt").unlink()
    result = publish(project, "--static", str(tmp_path / "static"))
    assert result.returncode == 1
    assert (
        f"error: {project / 'wheelhouse' / 'requirements.txt'} is missing: run "
        "`nox -s build_wheels` first\n"
    ) in result.stderr
    assert not (tmp_path / "static").exists()


def test_malformed_sha256sums_is_a_clear_error(project: Path, tmp_path: Path) -> None:
    (project / "wheelhouse" / "SHA256SUMS").write_text("not a checksum line\n")
    result = publish(project, "--static", str(tmp_path / "static"))
    assert result.returncode == 1
    assert "SHA256SUMS:1 is not '<sha256>  <wheel file name>'" in result.stderr
    assert "Traceback" not in result.stderr


def test_credentials_appear_nowhere(project: Path, index: Any, tmp_path: Path) -> None:
    results = [
        publish(project, "--repository-url", index.upload, "--index-url", index.simple),
        publish(
            project,
            "--repository-url",
            index.upload,
            "--index-url",
            index.simple,
            password="wrong-password-0000",
        ),
        publish(project, "--static", str(tmp_path / "static")),
    ]
    for result in results:
        assert PASSWORD not in result.stdout + result.stderr
        assert "wrong-password-0000" not in result.stdout + result.stderr
    written = [p for base in (project, tmp_path / "static") for p in base.rglob("*") if p.is_file()]
    assert written
    for path in written:
        assert PASSWORD.encode() not in path.read_bytes(), path


def published_copy(built_project: Path, tmp_path: Path) -> Path:
    """A project root holding this repo's pins and a copy of the built wheelhouse (its
    envelopes included), to publish from."""
    root = tmp_path / "published"
    root.mkdir()
    shutil.copy(REPO / "pins.toml", root)
    shutil.copytree(built_project / "wheelhouse", root / "wheelhouse")
    return root


@pytest.mark.slow
def test_publishes_what_build_wheels_produced(
    built_project: Path, index: Any, tmp_path: Any
) -> None:
    """The README's node command against the published index alone (no fallback to the
    public one): our wheels and flashinfer-cubin, which publish took along, hash-checked."""
    root = published_copy(built_project, tmp_path)
    result = publish(root, "--repository-url", index.upload, "--index-url", index.simple)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count(": uploaded") == 5  # our four wheels and flashinfer-cubin
    venv = tmp_path / "node-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    only_the_index = {
        "PATH": os.environ["PATH"],
        "HOME": str(tmp_path),
        "PIP_CONFIG_FILE": os.devnull,
    }
    installed_now = hash_checked_install(
        venv / "bin/python", root / "wheelhouse/requirements.txt", "--index-url", index.simple
    )
    assert installed_now.returncode == 0, installed_now.stderr
    installed = installed_versions(venv / "bin/python", only_the_index)
    for name, version in required_versions(root).items():
        assert installed[name] == version
    assert "flashinfer-cubin" in installed


@pytest.mark.slow
def test_the_verifying_node_recipe_installs_the_signed_build_and_refuses_a_swap(
    built_project: Path, index: Any, tmp_path: Any
) -> None:
    """README's verifying recipe, on the real signed build: publish to the index (fallback
    off) and a static tree; on the node, the wheels from the index, the lock directory from
    the tree, sm120-verify-provenance, then pip from the verified files alone. A wheel
    swapped on the index after signing is refused, and nothing is installed."""
    root = published_copy(built_project, tmp_path)
    uploaded = publish(root, "--repository-url", index.upload, "--index-url", index.simple)
    assert uploaded.returncode == 0, uploaded.stderr
    assert "provenance envelopes not uploaded: an index takes distributions only" in (
        uploaded.stderr
    )
    static = publish(root, "--static", str(tmp_path / "static"))
    assert static.returncode == 0, static.stderr
    (lock_dir,) = (tmp_path / "static" / "locks").iterdir()
    key = built_project.parent / "sign.pub"

    def node(files: Path) -> subprocess.CompletedProcess[str]:
        downloaded = subprocess.run(
            [
                sys.executable,
                "-m",
                "pip",
                "download",
                "--quiet",
                "--require-hashes",
                "--no-deps",
                "--index-url",
                index.simple,
                "-r",
                str(lock_dir / "requirements.txt"),
                "-d",
                str(files),
            ],
            env={"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull},
            capture_output=True,
            text=True,
        )
        assert downloaded.returncode == 0, downloaded.stderr
        for name in [
            "SHA256SUMS",
            "requirements.txt",
            *(p.name for p in lock_dir.glob("*.intoto.jsonl")),
        ]:
            shutil.copy(lock_dir / name, files)
        return verify_provenance(files)

    def verify_provenance(files: Path) -> subprocess.CompletedProcess[str]:
        lock = str(files / "requirements.txt")
        tool = [sys.executable, "-m", "sm120_build.node.provenance"]
        return subprocess.run(
            [*tool, str(files), "--trust-key", str(key), "--lock", lock],
            capture_output=True,
            text=True,
        )

    verified = node(tmp_path / "ours")
    assert verified.returncode == 0, verified.stderr
    assert verified.stdout.count("verified: ") == 4  # our four wheels
    venv = tmp_path / "node-venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    installed_now = hash_checked_install(
        venv / "bin/python",
        tmp_path / "ours" / "requirements.txt",
        "--no-index",
        "--find-links",
        str(tmp_path / "ours"),
    )
    assert installed_now.returncode == 0, installed_now.stderr
    env = {"PATH": os.environ["PATH"], "HOME": str(tmp_path), "PIP_CONFIG_FILE": os.devnull}
    installed = installed_versions(venv / "bin/python", env)
    for name, version in required_versions(root).items():
        assert installed[name] == version

    # The index serves another file under our sglang wheel's name (as a writer of the
    # index could arrange): it is refused before anything is installed.
    (sglang,) = (index.packages).glob("sglang-*.whl")
    other = small_wheel(tmp_path, "sglang", sglang.name.split("-")[1], "swapped = True\n")
    shutil.move(other, sglang)
    swapped = tmp_path / "swapped"
    swapped.mkdir()
    for made in (tmp_path / "ours").glob("*.whl"):
        shutil.copy(made, swapped)
    shutil.copy(sglang, swapped / sglang.name)
    for name in [
        "SHA256SUMS",
        "requirements.txt",
        *(p.name for p in lock_dir.glob("*.intoto.jsonl")),
    ]:
        shutil.copy(lock_dir / name, swapped)
    refused = verify_provenance(swapped)
    assert refused.returncode == 1
    assert f"{sglang.name}: the signed sha256 is" in refused.stderr
    assert "the wheel was replaced after it was signed" in refused.stderr
