"""Publish a staged tree to the Hub in one atomic commit, or print what that commit would do.

Order: gate (no network) -> token present -> Hub reachable and the token accepted (``whoami``)
-> stage -> repo created if missing -> remote tree listed -> plan (added, changed, deleted
against the remote head) -> one ``create_commit`` holding every operation, with the remote head as
``parent_commit`` so a concurrent change fails it instead of being overwritten. A Hub failure
anywhere leaves the branch as it was: the Hub applies a commit whole or not at all. A dry run
needs neither token nor network: without them it stages and lists the tree, saying it could not
compare it with the remote.
"""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from pathlib import Path

from anetts.artifacts import HF_SCHEME, atomic_file, file_sha256, write_json
from anetts.provenance import provenance
from anetts.publish.errors import PublishError
from anetts.publish.layout import PUBLISH_MANIFEST, check_gate, stage_tree

log = logging.getLogger(__name__)
PUBLISHED = "published.json"


def publish_dir(model_dir: Path) -> Path:
    return Path(model_dir) / "publish"


@dataclass
class Plan:
    added: list[str] = field(default_factory=list)
    changed: list[str] = field(default_factory=list)
    deleted: list[str] = field(default_factory=list)
    unchanged: list[str] = field(default_factory=list)
    remote_head: str | None = None

    @property
    def empty(self) -> bool:
        return not (self.added or self.changed or self.deleted)

    def render(self) -> str:
        out = [f"plan against {self.remote_head or 'an empty repo'}: {len(self.added)} added, {len(self.changed)} changed, "
               f"{len(self.deleted)} deleted, {len(self.unchanged)} unchanged"]
        for tag, paths in (("A", self.added), ("M", self.changed), ("D", self.deleted)):
            out += [f"  {tag} {p}" for p in paths]
        return "\n".join(out)


def _git_blob_sha1(path: Path) -> str:
    from huggingface_hub.utils.sha import git_hash

    return git_hash(Path(path).read_bytes())


def _api(endpoint: str | None, token: str | None):
    from huggingface_hub import HfApi

    return HfApi(endpoint=endpoint, token=token)


def _token(token: str | None) -> str:
    if token:
        return token
    from huggingface_hub import get_token

    found = get_token()  # HF_TOKEN, then the token `hf auth login` saved
    if not found:
        raise PublishError("no Hugging Face token: set HF_TOKEN or run `hf auth login`; nothing was sent")
    return found


def _connect(api, repo_id: str):
    import requests
    from huggingface_hub.errors import OfflineModeIsEnabled

    try:
        return api.whoami()
    except OfflineModeIsEnabled as e:  # a builtin ConnectionError, not requests'
        raise PublishError(f"Hugging Face offline mode is on (HF_HUB_OFFLINE): cannot reach the Hub at {api.endpoint}; "
                           f"nothing was sent for {repo_id}") from e
    except requests.exceptions.ConnectionError as e:
        raise PublishError(f"cannot reach the Hub at {api.endpoint} ({type(e).__name__}); nothing was sent for {repo_id}") from e
    except requests.exceptions.HTTPError as e:  # whoami re-raises a 401 as a plain HTTPError
        status = e.response.status_code if e.response is not None else "no answer"
        raise PublishError(f"the Hub at {api.endpoint} refused the token ({status}); nothing was sent") from e


def remote_files(api, repo_id: str, revision: str) -> tuple[str | None, dict[str, tuple[str, str | None]]]:
    """(head sha or None, path -> (git blob sha1, lfs sha256 or None)) of ``revision``; empty for a new repo."""
    from huggingface_hub.hf_api import RepoFile
    from huggingface_hub.utils import EntryNotFoundError, RepositoryNotFoundError, RevisionNotFoundError

    try:
        head = api.repo_info(repo_id, revision=revision).sha
    except RepositoryNotFoundError:
        return None, {}
    except RevisionNotFoundError:
        if revision != "main":  # a fresh repo's main may have no commit yet; other branches must exist
            raise PublishError(f"branch {revision!r} does not exist in {repo_id}; create it first "
                               f"(`hf repo branch create {repo_id} {revision}`) or publish to main") from None
        return None, {}
    out = {}
    try:
        for f in api.list_repo_tree(repo_id, revision=head, recursive=True):
            if isinstance(f, RepoFile):
                out[f.path] = (f.blob_id, f.lfs.sha256 if f.lfs else None)
    except EntryNotFoundError:
        pass
    return head, out


def make_plan(tree: Path, head: str | None, remote: dict[str, tuple[str, str | None]],
              sha256: dict[str, str] | None = None) -> Plan:
    """Added/changed/deleted of ``tree`` against the remote listing (``sha256``: known local hashes)."""
    plan = Plan(remote_head=head)
    sha256 = sha256 or {}
    local = sorted(p.relative_to(tree).as_posix() for p in Path(tree).rglob("*") if p.is_file())
    for rel in local:
        if rel not in remote:
            plan.added.append(rel)
            continue
        blob, lfs_sha = remote[rel]
        same = (lfs_sha == (sha256.get(rel) or file_sha256(tree / rel))) if lfs_sha else (blob == _git_blob_sha1(tree / rel))
        (plan.unchanged if same else plan.changed).append(rel)
    plan.deleted = sorted(set(remote) - set(local))
    return plan


def publish(model_dir: str | Path, repo_id: str, *, revision: str = "main", private: bool = False,
            dry_run: bool = False, token: str | None = None, endpoint: str | None = None,
            echo=print) -> dict:
    """Gate, stage under ``<model_dir>/publish/tree``, then commit it to ``repo_id`` (or only plan it).

    Returns the record written to ``<model_dir>/publish/published.json`` (not written by a dry run).
    """
    model_dir = Path(model_dir)
    if "/" not in repo_id or repo_id.count("/") != 1:
        raise PublishError(f"--repo-id must be OWNER/NAME, got {repo_id!r}")
    out = publish_dir(model_dir)
    tree = out / "tree"
    gated = check_gate(model_dir)  # no network needed to learn that a tree may not be published
    try:
        api = _api(endpoint, _token(token))
        _connect(api, repo_id)
    except PublishError as e:
        if not dry_run:
            raise
        api, unreachable = None, e
    manifest = stage_tree(model_dir, tree, repo_id, gated)
    echo(f"staged {len(manifest['files'])} files of {manifest['model']} in {tree}")
    if api is None:  # a dry run without token or Hub: the staged tree, not a plan
        echo(f"could not compare with the remote {repo_id}@{revision}: {unreachable}")
        staged = sorted(f for f in tree.rglob("*") if f.is_file())  # the files and the manifest listing them
        echo("\n".join(f"  {f.relative_to(tree).as_posix()} ({f.stat().st_size} bytes)" for f in staged))
        echo("dry run: nothing was sent")
        return {"dry_run": True, "compared": False, "files": manifest["files"]}
    if not dry_run:
        api.create_repo(repo_id, private=private, exist_ok=True)
    head, remote = remote_files(api, repo_id, revision)
    plan = make_plan(tree, head, remote, {f["path"]: f["sha256"] for f in manifest["files"]})
    echo(plan.render())
    project = provenance()
    if dry_run:
        echo("dry run: nothing was sent")
        return {"dry_run": True, "plan": plan.__dict__}
    if plan.empty:
        commit = head
        echo(f"{repo_id}@{revision} already holds this tree ({head}); no commit")
    else:
        from huggingface_hub import CommitOperationAdd, CommitOperationDelete

        ops = [CommitOperationAdd(path_in_repo=p, path_or_fileobj=str(tree / p)) for p in plan.added + plan.changed]
        ops += [CommitOperationDelete(path_in_repo=p) for p in plan.deleted]
        git = project["git"]
        message = f"anetts publish {manifest['model']} from ane-tts {git.get('commit') or 'unknown commit'}"
        if git.get("dirty"):
            message += " (dirty tree)"
        try:
            info = api.create_commit(repo_id, ops, commit_message=message, revision=revision,
                                     parent_commit=head, commit_description=plan.render())
        except Exception as e:  # the Hub's errors are many types; the branch is unchanged either way
            raise PublishError(f"commit to {repo_id}@{revision} failed, the Hub kept its previous state "
                               f"({head or 'empty'}): {type(e).__name__}: {e}") from e
        commit = info.oid
        echo(f"committed {len(ops)} operation(s) to {repo_id}@{revision}: {commit}")
    record = {"repo_id": repo_id, "revision": revision, "commit": commit, "endpoint": api.endpoint,
              "load": f"{HF_SCHEME}{repo_id}@{commit}", "variants": sorted(manifest["variants"]),
              "files": len(manifest["files"]), "plan": {k: len(v) for k, v in plan.__dict__.items() if isinstance(v, list)},
              "manifest_sha256": file_sha256(tree / PUBLISH_MANIFEST), "provenance": project}
    with atomic_file(out / PUBLISHED) as tmp:
        write_json(tmp, record)
    return record


