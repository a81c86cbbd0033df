"""A thin, reproducible wrapper around the git command line for the vendor trees.

Commits get a fixed identity and date, and the user's git configuration is ignored, so the
same sdist and patches give the same commit ids on every machine.
"""

from __future__ import annotations

import io
import os
import subprocess
from pathlib import Path

from .errors import UserError
from .tarfiles import tarfile

FIXED_DATE = "2000-01-01T00:00:00+0000"
_IDENTITY = {
    "GIT_AUTHOR_NAME": "sm120-build",
    "GIT_AUTHOR_EMAIL": "sm120-build@localhost",
    "GIT_AUTHOR_DATE": FIXED_DATE,
    "GIT_COMMITTER_NAME": "sm120-build",
    "GIT_COMMITTER_EMAIL": "sm120-build@localhost",
    "GIT_COMMITTER_DATE": FIXED_DATE,
}


def git_environment(repo: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.update(_IDENTITY)
    # Ignore ~/.gitconfig and /etc/gitconfig (autocrlf, hooks, signing would change commits),
    # and never let git climb out of vendor/<name> into the project's own repository.
    env["GIT_CONFIG_GLOBAL"] = os.devnull
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    env["GIT_CEILING_DIRECTORIES"] = str(repo.resolve().parent)
    return env


# Hooks and fsmonitor are programs git would run on our behalf; a vendor tree holds
# downloaded content, so git runs nothing but itself.
_SAFE_OPTIONS = ("-c", "core.hooksPath=/dev/null", "-c", "core.fsmonitor=false")


def git(
    repo: Path,
    *args: str,
    check: bool = True,
    stdin: str | None = None,
    index: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """git in `repo`; with `index`, on that index file instead of the repository's own."""
    env = git_environment(repo)
    if index is not None:
        env["GIT_INDEX_FILE"] = str(index)
    result = subprocess.run(
        ["git", *_SAFE_OPTIONS, *args],
        cwd=repo,
        env=env,
        input=stdin,
        capture_output=True,
        text=True,
    )
    if check and result.returncode != 0:
        raise UserError(f"git {' '.join(args)} failed in {repo}:\n{result.stderr.strip()}")
    return result


def git_bytes(repo: Path, *args: str) -> bytes:
    """git's output as bytes, for what may not be UTF-8 text (a diff, a message)."""
    result = subprocess.run(
        ["git", *_SAFE_OPTIONS, *args], cwd=repo, env=git_environment(repo), capture_output=True
    )
    if result.returncode != 0:
        stderr = result.stderr.decode(errors="replace").strip()
        raise UserError(f"git {' '.join(args)} failed in {repo}:\n{stderr}")
    return result.stdout


def commit_message(repo: Path, commit: str) -> str:
    """The message exactly as stored (git log would re-indent and re-wrap it)."""
    raw = git_bytes(repo, "cat-file", "commit", commit).split(b"\n\n", 1)[1]
    try:
        return raw.decode()
    except UnicodeDecodeError:
        raise UserError(
            f"{repo.name} commit {commit[:12]}: its message is not UTF-8 text; a patch header "
            "is. Reword it (git commit --amend) and export again."
        ) from None


def head(repo: Path) -> str:
    return git(repo, "rev-parse", "HEAD").stdout.strip()


def export_tree(tree: Path, destination: Path, revision: str = "HEAD") -> None:
    """Copy a committed state of a vendor tree (without .git) to destination."""
    result = subprocess.run(
        ["git", *_SAFE_OPTIONS, "archive", "--format=tar", revision],
        cwd=tree,
        env=git_environment(tree),
        capture_output=True,
    )
    if result.returncode != 0:
        raise UserError(
            f"git archive {revision} failed in {tree}:\n"
            f"{result.stderr.decode(errors='replace').strip()}\n"
            f"Check that {tree} is a vendor tree (`nox -s vendor` makes it)."
        )
    archive = result.stdout
    destination.mkdir(parents=True)
    with tarfile().open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(destination, filter="data")
