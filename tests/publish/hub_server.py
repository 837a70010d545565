"""A loopback Hub write server for tests: the commit protocol of huggingface_hub, into git repos olah serves.

No upload-capable Hub server installs from the package registries (olah is read-only), so the
publish tests run the real ``huggingface_hub`` client against this one. It implements what
``HfApi.whoami / create_repo / list_repo_tree / create_commit`` send:

    GET  /api/whoami-v2                                   token check
    POST /api/repos/create                                git init mirrors/models/<ns>/<name>
    POST /api/validate-yaml                               README front matter accepted
    GET  /api/models/<ns>/<name>/revision/<rev>           repo info (sha, siblings)
    GET  /api/models/<ns>/<name>/tree/<rev>[/<path>]      files with blob oid, size, lfs sha256
    POST /api/models/<ns>/<name>/preupload/<rev>          uploadMode per file (binary or > 10 MiB: lfs)
    POST /<ns>/<name>.git/info/lfs/objects/batch          basic transfer, PUT back to this server
    PUT  /_lfs/<ns>/<name>/<oid>                          stores the object (sha256 checked); a commit links it
                                                          to the repo's .git/lfs/objects/aa/bb/<oid>
    POST /api/models/<ns>/<name>/commit/<rev>             ndjson header/file/lfsFile/deletedFile/deletedFolder

Each commit is built with git plumbing in a private index and becomes visible only through one
``git update-ref`` compare-and-swap, so a failure at any point leaves the branch where it was.
LFS files are committed as real pointer files with the object under ``.git/lfs/objects``: the
layout olah's mirror mode reads.

Fault injection for tests: ``POST /_control`` with ``{"fail_commit": N}`` makes the next N commit
requests fail after their blobs are written (500, branch untouched).

Run: ``python hub_server.py --mirrors DIR --port N --token T`` (prints ``READY <port>``).
"""
from __future__ import annotations

import argparse
import base64
import fnmatch
import hashlib
import json
import os
import re
import subprocess
import sys
import tempfile
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, unquote, urlparse

LFS_THRESHOLD = 10 * 1024 * 1024  # the Hub refuses regular files above 10 MiB
# a subset of the .gitattributes the Hub gives a new repo: these always go through LFS
DEFAULT_LFS = ("*.bin", "*.mlmodel", "*.pt", "*.pth", "*.npz", "*.npy", "*.onnx", "*.safetensors", "*.zip", "*.png")
POINTER = "version https://git-lfs.github.com/spec/v1\noid sha256:{oid}\nsize {size}\n"
POINTER_RE = re.compile(rb"^version https://git-lfs\.github\.com/spec/v1\noid sha256:([0-9a-f]{64})\nsize (\d+)\n$")
NAME = r"[A-Za-z0-9][A-Za-z0-9._-]*"


class HubError(Exception):
    """An error answer; ``code`` is the Hub's X-Error-Code, which huggingface_hub maps to its error types."""

    def __init__(self, status: int, message: str, code: str | None = None):
        super().__init__(message)
        self.status = status
        self.code = code


class Store:
    def __init__(self, mirrors: Path, token: str):
        self.root = Path(mirrors) / "models"
        # content-addressed like the Hub's storage: an object uploaded once is linked into every repo
        # that commits it, so publishing the same build to several test repos uploads it once
        self.objects = Path(mirrors) / "lfs-store"
        self.token = token
        self.lock = threading.Lock()  # one ref update at a time (commits are still CAS on the ref)
        self.fail_commit = 0

    # -- git ----------------------------------------------------------------------------------
    def repo(self, ns: str, name: str, must_exist: bool = True) -> Path:
        if not (re.fullmatch(NAME, ns) and re.fullmatch(NAME, name)):
            raise HubError(400, f"invalid repo id {ns}/{name}")
        path = self.root / ns / name
        if must_exist and not (path / ".git").is_dir():
            raise HubError(404, f"Repository Not Found for url: {ns}/{name}", "RepoNotFound")
        return path

    @staticmethod
    def git(repo: Path, *args: str, input: bytes | None = None, env: dict | None = None) -> str:
        proc = subprocess.run(["git", "-C", str(repo), *args], input=input, capture_output=True,
                              env={**os.environ, "GIT_AUTHOR_NAME": "hub", "GIT_AUTHOR_EMAIL": "hub@localhost",
                                   "GIT_COMMITTER_NAME": "hub", "GIT_COMMITTER_EMAIL": "hub@localhost", **(env or {})})
        if proc.returncode != 0:
            raise HubError(500, f"git {args[0]} failed: {proc.stderr.decode(errors='replace')}")
        return proc.stdout.decode()

    def head(self, repo: Path, rev: str) -> str | None:
        proc = subprocess.run(["git", "-C", str(repo), "rev-parse", "--verify", "-q", f"{rev}^{{commit}}"],
                              capture_output=True, text=True)
        return proc.stdout.strip() or None

    def files(self, repo: Path, sha: str) -> dict[str, tuple[str, int]]:
        """path -> (blob sha1, blob size) at commit ``sha``."""
        out = {}
        for line in self.git(repo, "ls-tree", "-r", "-l", "-z", sha).split("\0"):
            if not line:
                continue
            meta, path = line.split("\t", 1)
            _mode, kind, blob, size = meta.split()
            if kind == "blob":
                out[path] = (blob, int(size))
        return out

    def lfs_object(self, repo: Path, oid: str) -> Path:
        return repo / ".git" / "lfs" / "objects" / oid[:2] / oid[2:4] / oid

    def stored(self, oid: str) -> Path:
        return self.objects / oid

    def link_object(self, repo: Path, oid: str) -> Path:
        obj = self.lfs_object(repo, oid)
        if not obj.is_file():
            obj.parent.mkdir(parents=True, exist_ok=True)
            os.link(self.stored(oid), obj)
        return obj

    def lfs_info(self, repo: Path, blob: str, size: int) -> dict | None:
        if size > 200:
            return None
        m = POINTER_RE.match(self.git(repo, "cat-file", "blob", blob).encode())
        return {"oid": m.group(1).decode(), "size": int(m.group(2)), "pointerSize": size} if m else None

    def create(self, ns: str, name: str) -> tuple[bool, Path]:
        path = self.repo(ns, name, must_exist=False)
        with self.lock:
            if (path / ".git").is_dir():
                return False, path
            path.mkdir(parents=True, exist_ok=True)
            self.git(path, "init", "-q", "-b", "main")
            return True, path

    def commit(self, repo: Path, rev: str, lines: list[dict]) -> str:
        header = next((item["value"] for item in lines if item.get("key") == "header"), None)
        if header is None:
            raise HubError(400, "commit payload has no header")
        with tempfile.TemporaryDirectory(prefix="hub-index-") as tmp:
            env = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
            parent = self.head(repo, rev)
            if parent is None and rev != "main":
                raise HubError(404, f"Revision Not Found: {rev}", "RevisionNotFound")
            if header.get("parentCommit") and header["parentCommit"] != parent:
                raise HubError(412, f"parent commit {header['parentCommit']} is not the head of {rev} ({parent})")
            if parent:
                self.git(repo, "read-tree", parent, env=env)
            for item in lines:
                key, value = item.get("key"), item.get("value", {})
                if key == "file":
                    data = base64.b64decode(value["content"])
                    blob = self.git(repo, "hash-object", "-w", "--stdin", input=data).strip()
                    self.git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{value['path']}", env=env)
                elif key == "lfsFile":
                    oid = value["oid"]
                    if not self.stored(oid).is_file():
                        raise HubError(422, f"LFS object {oid} of {value['path']} was never uploaded")
                    obj = self.link_object(repo, oid)
                    pointer = POINTER.format(oid=oid, size=obj.stat().st_size).encode()
                    blob = self.git(repo, "hash-object", "-w", "--stdin", input=pointer).strip()
                    self.git(repo, "update-index", "--add", "--cacheinfo", f"100644,{blob},{value['path']}", env=env)
                elif key == "deletedFile":
                    self.git(repo, "update-index", "--force-remove", value["path"], env=env)
                elif key == "deletedFolder":
                    listed = self.git(repo, "ls-files", "-z", "--", value["path"].rstrip("/") + "/", env=env)
                    for p in filter(None, listed.split("\0")):
                        self.git(repo, "update-index", "--force-remove", p, env=env)
                elif key != "header":
                    raise HubError(400, f"unknown commit operation {key!r}")
            if self.fail_commit > 0:  # blobs are written, the ref is not: what a crash mid-commit leaves
                self.fail_commit -= 1
                raise HubError(500, "injected failure mid-commit")
            tree = self.git(repo, "write-tree", env=env).strip()
            message = header.get("summary", "") + ("\n\n" + header["description"] if header.get("description") else "")
            args = ["commit-tree", tree, "-m", message or "commit"] + (["-p", parent] if parent else [])
            sha = self.git(repo, *args).strip()
            with self.lock:
                # compare-and-swap: a concurrent commit to the same branch makes this one fail
                self.git(repo, "update-ref", f"refs/heads/{rev}", sha, parent or "0" * 40)
            return sha


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    store: Store

    def log_message(self, fmt, *args):  # quiet: the test output would drown in request lines
        if os.environ.get("HUB_SERVER_VERBOSE"):
            super().log_message(fmt, *args)

    # -- plumbing -------------------------------------------------------------------------------
    def _send(self, status: int, body, headers: dict | None = None):
        data = body if isinstance(body, bytes) else json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for k, v in (headers or {}).items():
            self.send_header(k, v)
        self.end_headers()
        self.wfile.write(data)

    def _body(self) -> bytes:
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _auth(self):
        if self.headers.get("Authorization") != f"Bearer {self.store.token}":
            raise HubError(401, "Invalid credentials in Authorization header")

    def _base(self) -> str:
        return f"http://{self.headers.get('Host')}"

    def _dispatch(self, method: str):
        url = urlparse(self.path)
        path, query = unquote(url.path), parse_qs(url.query)
        try:
            body = self._body() if method in ("POST", "PUT") else b""
            for pattern, handler in ROUTES[method]:
                m = re.fullmatch(pattern, path)
                if m:
                    return handler(self, *m.groups(), body=body, query=query)
            raise HubError(404, f"no route {method} {path}")
        except HubError as e:
            headers = {"X-Error-Message": str(e).splitlines()[0][:200], **({"X-Error-Code": e.code} if e.code else {})}
            self._send(e.status, {"error": str(e)}, headers)

    def do_GET(self):
        self._dispatch("GET")

    def do_POST(self):
        self._dispatch("POST")

    def do_PUT(self):
        self._dispatch("PUT")

    # -- routes -----------------------------------------------------------------------------------
    def whoami(self, body, query):
        self._auth()
        self._send(200, {"type": "user", "name": "tester", "auth": {"type": "access_token",
                                                                      "accessToken": {"role": "write"}}})

    def create_repo(self, body, query):
        self._auth()
        req = json.loads(body or b"{}")
        if req.get("type", "model") not in (None, "model"):
            raise HubError(400, "this server holds model repos only")
        ns, name = req.get("organization") or "tester", req["name"]
        created, _ = self.store.create(ns, name)
        url = f"{self._base()}/{ns}/{name}"
        # the Hub answers an existing repo with 409 and its url (create_repo(exist_ok=True) reads it)
        self._send(200 if created else 409, {"url": url, "name": f"{ns}/{name}",
                                             **({} if created else {"error": "You already created this model repo"})})

    def validate_yaml(self, body, query):
        self._send(200, {"errors": [], "warnings": []})

    def revision(self, ns, name, rev, body, query):
        repo = self.store.repo(ns, name)
        sha = self.store.head(repo, rev)
        if sha is None:
            raise HubError(404, f"Revision Not Found: {rev}", "RevisionNotFound")
        files = self.store.files(repo, sha)
        self._send(200, {"id": f"{ns}/{name}", "modelId": f"{ns}/{name}", "sha": sha, "private": False,
                         "siblings": [{"rfilename": p} for p in sorted(files)]}, {"X-Repo-Commit": sha})

    def tree(self, ns, name, rev, sub, body, query):
        repo = self.store.repo(ns, name)
        sha = self.store.head(repo, rev)
        if sha is None:
            if rev == "main":  # a repo without commits has an empty main
                return self._send(200, [])
            raise HubError(404, f"Revision Not Found: {rev}", "RevisionNotFound")
        prefix = (sub or "").strip("/")
        out = []
        for p, (blob, size) in sorted(self.store.files(repo, sha).items()):
            if prefix and not p.startswith(prefix + "/"):
                continue
            entry = {"type": "file", "oid": blob, "size": size, "path": p}
            lfs = self.store.lfs_info(repo, blob, size)
            if lfs:
                entry["lfs"] = lfs
                entry["size"] = lfs["size"]
            out.append(entry)
        self._send(200, out)

    def preupload(self, ns, name, rev, body, query):
        self._auth()
        repo = self.store.repo(ns, name)
        sha = self.store.head(repo, rev)
        existing = self.store.files(repo, sha) if sha else {}
        answer = []
        for f in json.loads(body)["files"]:
            sample = base64.b64decode(f["sample"])
            lfs_rule = any(fnmatch.fnmatch(f["path"].rsplit("/", 1)[-1], pat) for pat in DEFAULT_LFS)
            mode = "lfs" if lfs_rule or f["size"] > LFS_THRESHOLD or b"\0" in sample else "regular"
            oid = None
            if f["path"] in existing:
                blob, size = existing[f["path"]]
                lfs = self.store.lfs_info(repo, blob, size)
                oid = lfs["oid"] if lfs else blob
            answer.append({"path": f["path"], "uploadMode": mode, "shouldIgnore": False, "oid": oid})
        self._send(200, {"files": answer, "commitOid": sha})

    def lfs_batch(self, ns, name, body, query):
        self._auth()
        self.store.repo(ns, name)  # 404 for a repo that does not exist
        req = json.loads(body)
        if req.get("operation") != "upload":
            raise HubError(400, "only uploads are served here (downloads go through olah)")
        objects = []
        for o in req["objects"]:
            entry = {"oid": o["oid"], "size": o["size"]}
            if not self.store.stored(o["oid"]).is_file():
                entry["actions"] = {"upload": {"href": f"{self._base()}/_lfs/{ns}/{name}/{o['oid']}"}}
            objects.append(entry)
        self._send(200, {"transfer": "basic", "objects": objects})

    def lfs_put(self, ns, name, oid, body, query):
        self.store.repo(ns, name)  # 404 for a repo that does not exist
        if hashlib.sha256(body).hexdigest() != oid:
            raise HubError(400, f"LFS object does not match its oid {oid}")
        obj = self.store.stored(oid)
        obj.parent.mkdir(parents=True, exist_ok=True)
        tmp = obj.with_name(f"{oid}.{threading.get_ident()}.tmp")
        tmp.write_bytes(body)
        os.replace(tmp, obj)
        self._send(200, {})

    def commit(self, ns, name, rev, body, query):
        self._auth()
        repo = self.store.repo(ns, name)
        lines = [json.loads(line) for line in body.splitlines() if line.strip()]
        sha = self.store.commit(repo, rev, lines)
        self._send(200, {"success": True, "commitOid": sha, "commitUrl": f"{self._base()}/{ns}/{name}/commit/{sha}"})

    def control(self, body, query):
        req = json.loads(body or b"{}")
        self.store.fail_commit = int(req.get("fail_commit", 0))
        self._send(200, {"fail_commit": self.store.fail_commit})


_R = rf"({NAME})/({NAME})"
ROUTES = {
    "GET": [
        (r"/api/whoami-v2", Handler.whoami),
        (rf"/api/models/{_R}/revision/([^/]+)", Handler.revision),
        (rf"/api/models/{_R}/tree/([^/]+)(/.*)?", Handler.tree),
    ],
    "POST": [
        (r"/api/repos/create", Handler.create_repo),
        (r"/api/validate-yaml", Handler.validate_yaml),
        (rf"/api/models/{_R}/preupload/([^/]+)", Handler.preupload),
        (rf"/api/models/{_R}/commit/([^/]+)", Handler.commit),
        (rf"/{_R}\.git/info/lfs/objects/batch", Handler.lfs_batch),
        (r"/_control", Handler.control),
    ],
    "PUT": [
        (rf"/_lfs/{_R}/([0-9a-f]{{64}})", Handler.lfs_put),
    ],
}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mirrors", type=Path, required=True, help="olah's mirrors-path (repos go to models/<ns>/<name>)")
    ap.add_argument("--port", type=int, default=0, help="0: any free port (printed)")
    ap.add_argument("--token", required=True, help="the bearer token write requests must carry")
    args = ap.parse_args(argv)
    Handler.store = Store(args.mirrors, args.token)
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"READY {server.server_address[1]}", flush=True)
    server.serve_forever()
    return 0


if __name__ == "__main__":
    sys.exit(main())
