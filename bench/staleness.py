"""Is a recorded figure still about this tree? Computed from git, never set by hand.

A result file (``docs/bench/*.json``) names the commit it measured and the paths it measures
(``provenance.measured``; ``provenance.MEASURED`` for files written before that field). The
figure is *stale* when commits since that one touched those paths:

    git log --format=%H COMMIT..HEAD -- PATHS     # one line per commit

Uncommitted changes under the paths (modified, staged or untracked files) count as one more
commit, the one about to be made, so a doc generated before a commit still reads the same
after it. A file that recorded the digest of its measured sources is current whatever the
count when the tree's sources have that digest (code changed and changed back, or a dirty
run whose changes were committed as they were). The same digest, recomputed from the named
commit's objects, says whether the file's commit label is true (a copied tree without
``.git`` is labelled by hand through ``ZOO_BENCH_COMMIT``).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from provenance import digest, git, is_source, tree_sources


def has_history(root: Path) -> bool:
    return git("rev-parse", "--verify", "-q", "HEAD", root=root) is not None


def known_commit(root: Path, commit: str) -> bool:
    return git("cat-file", "-e", f"{commit}^{{commit}}", root=root) is not None


def commits_touching(root: Path, commit: str, paths: tuple[str, ...]) -> int:
    """Commits in ``commit..HEAD`` that touched ``paths``, plus one for uncommitted changes."""
    log = git("log", "--format=%H", f"{commit}..HEAD", "--", *paths, root=root) or b""
    status = git("status", "--porcelain", "--untracked-files=all", "--", *paths, root=root) or b""
    return len(log.split()) + (1 if status.strip() else 0)


def sources_at(root: Path, commit: str, paths: tuple[str, ...]) -> dict[str, bytes] | None:
    """The .py/.sh files under ``paths`` as they were at ``commit`` (from git's objects)."""
    listing = git("ls-tree", "-r", "-z", "--name-only", commit, "--", *paths, root=root)
    if listing is None:
        return None
    names = [n.decode() for n in listing.split(b"\0") if n and is_source(n.decode())]
    if not names:
        return {}
    batch = git(
        "cat-file",
        "--batch",
        root=root,
        stdin="".join(f"{commit}:{n}\n" for n in names).encode(),
    )
    if batch is None:
        return None
    out, pos = {}, 0
    for name in names:  # "<sha> blob <size>\n<bytes>\n" per name, in order
        eol = batch.index(b"\n", pos)
        size = int(batch[pos:eol].split()[2])
        out[name] = batch[eol + 1 : eol + 1 + size]
        pos = eol + 1 + size + 1
    return out


@dataclass(frozen=True)
class Staleness:
    """What the doc says about one result file's figures."""

    commit: str | None  # the commit the file names
    date: str  # the day it was measured (YYYY-MM-DD)
    commits_since: int | None  # None: could not be counted (``unknown`` says why)
    unknown: str = ""
    label_true: bool | None = (
        None  # the file's sources digest equals its commit's (None: no digest)
    )

    @property
    def stale(self) -> bool:
        return self.commits_since != 0

    def count_text(self) -> str:
        if self.commits_since is None:
            return f"stale? {self.unknown}"
        if self.commits_since == 0:
            return "current"
        n = self.commits_since
        return f"stale: {n} commit{'s' if n != 1 else ''} touched the measured code since"

    def label_text(self) -> str:
        return "its measured sources are not that commit's" if self.label_true is False else ""

    def mark(self) -> str:
        """The words the doc shows beside the figures."""
        return "; ".join(x for x in (self.count_text(), self.label_text()) if x)


def staleness(
    root: Path,
    *,
    commit: str | None,
    date: str,
    paths: tuple[str, ...],
    measured_sha256: str | None = None,
    label: tuple[tuple[str, ...], str] | None = None,
) -> Staleness:
    """The staleness of a figure measured at ``commit`` over ``paths``.

    Args:
        measured_sha256: the digest of the sources under ``paths`` when it was measured;
            the tree having the same digest makes it current.
        label: (paths, digest) recorded for a clean tree: checked against ``commit``'s sources.
    """
    if not has_history(root):
        return Staleness(commit, date, None, "no git history in this checkout")
    if not commit:
        return Staleness(commit, date, None, "the file names no commit")
    if not known_commit(root, commit):
        return Staleness(commit, date, None, f"commit `{commit[:7]}` is not in this history")
    label_true = None
    if label is not None:
        at = sources_at(root, commit, label[0])
        label_true = None if at is None else digest(at, label[0]) == label[1]
    if measured_sha256 and digest(tree_sources(paths, root), paths) == measured_sha256:
        return Staleness(commit, date, 0, label_true=label_true)
    return Staleness(commit, date, commits_touching(root, commit, paths), label_true=label_true)
