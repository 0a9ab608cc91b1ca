"""A Hub-compatible HTTP endpoint on 127.0.0.1, in memory, with the routes `huggingface_hub` and `transformers`
use to push and to load a model: repo create, branch create, preupload, LFS batch + upload, commit (NDJSON),
validate-yaml, model and revision info, tree listing, resolve (HEAD/GET, Range, 404 with X-Error-Code).

It records what was uploaded (`lfs_uploads`, `commits`) so tests can check that an unchanged push sends nothing.
"""

from __future__ import annotations

import base64
import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, unquote, urlparse

LFS_SUFFIXES = (".safetensors", ".bin", ".pt", ".png", ".h5", ".msgpack")


def git_blob_sha1(content: bytes) -> str:
    return hashlib.sha1(b"blob %d\0" % len(content) + content).hexdigest()


@dataclass
class Repo:
    private: bool = False
    branches: dict[str, dict[str, bytes]] = field(default_factory=dict)  # branch -> {path: content}
    heads: dict[str, str] = field(default_factory=dict)  # branch -> commit sha
    lfs_paths: set[str] = field(default_factory=set)


class FakeHub:
    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.lfs_objects: dict[str, bytes] = {}
        self.lfs_uploads: list[str] = []  # oids PUT, in order
        self.commits: list[tuple[str, str, list[str]]] = []  # (repo, branch, paths changed)
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self._thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FakeHub:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    # --- state changes ---------------------------------------------------------------------------------------

    def commit(self, repo_id: str, branch: str, files: dict[str, bytes | None], message: str) -> str:
        repo = self.repos[repo_id]
        tree = dict(repo.branches.get(branch, {}))
        for path, content in files.items():
            if content is None:
                tree.pop(path, None)
            else:
                tree[path] = content
        parent = repo.heads.get(branch, "")
        digest = hashlib.sha1(f"{parent}{message}{len(self.commits)}".encode())
        for path in sorted(tree):
            digest.update(path.encode() + git_blob_sha1(tree[path]).encode())
        sha = digest.hexdigest()
        repo.branches[branch], repo.heads[branch] = tree, sha
        self.commits.append((repo_id, branch, sorted(files)))
        return sha

    # --- HTTP -------------------------------------------------------------------------------------------------

    def _handler(self):
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args) -> None:  # keep test output clean
                pass

            def _body(self) -> bytes:
                length = int(self.headers.get("Content-Length") or 0)
                return self.rfile.read(length) if length else b""

            def _send(self, status: int, body: bytes = b"", headers: dict | None = None, head: bool = False) -> None:
                self.send_response(status)
                for key, value in (headers or {}).items():
                    self.send_header(key, str(value))
                if "Content-Length" not in (headers or {}):
                    self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if body and not head:
                    self.wfile.write(body)

            def _json(self, status: int, payload, headers: dict | None = None) -> None:
                body = json.dumps(payload).encode()
                self._send(status, body, {"Content-Type": "application/json", **(headers or {})})

            def _error(self, status: int, code: str, message: str, head: bool = False) -> None:
                body = json.dumps({"error": message}).encode()
                headers = {"X-Error-Code": code, "X-Error-Message": message, "Content-Type": "application/json"}
                self._send(status, body, headers, head=head)

            def _repo(self, repo_id: str, head: bool = False) -> Repo | None:
                repo = hub.repos.get(repo_id)
                if repo is None:
                    self._error(404, "RepoNotFound", f"Repository {repo_id} not found", head)
                return repo

            def _tree(self, repo: Repo, revision: str, head: bool = False) -> dict[str, bytes] | None:
                revision = unquote(revision)
                if revision in repo.branches:
                    return repo.branches[revision]
                for branch, sha in repo.heads.items():
                    if sha == revision:
                        return repo.branches[branch]
                self._error(404, "RevisionNotFound", f"Invalid rev id: {revision}", head)
                return None

            def _sha(self, repo: Repo, revision: str) -> str:
                revision = unquote(revision)
                return repo.heads.get(revision, revision)

            # --- GET / HEAD ---

            def do_HEAD(self) -> None:
                self._get(head=True)

            def do_GET(self) -> None:
                self._get(head=False)

            def _get(self, head: bool) -> None:
                url = urlparse(self.path)
                path = url.path
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path):
                    repo = self._repo(m[1])
                    if repo is None:
                        return
                    revision = m[2] or "main"
                    tree = self._tree(repo, revision)
                    if tree is None:
                        return
                    return self._json(200, {
                        "id": m[1], "modelId": m[1], "sha": self._sha(repo, revision), "private": repo.private,
                        "siblings": [{"rfilename": p} for p in sorted(tree)], "tags": [], "downloads": 0,
                        "likes": 0, "library_name": "transformers",
                    })  # fmt: skip
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/tree/([^/]+)(?:/(.*))?", path):
                    repo = self._repo(m[1])
                    if repo is None:
                        return
                    tree = self._tree(repo, m[2])
                    if tree is None:
                        return
                    return self._list_tree(repo, tree, (m[3] or "").strip("/"), parse_qs(url.query))
                if m := re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path):
                    return self._resolve(m[1], m[2], unquote(m[3]), head)
                self._error(404, "EntryNotFound", f"no route for {path}", head)

            def _list_tree(self, repo: Repo, tree: dict[str, bytes], prefix: str, query: dict) -> None:
                recursive = query.get("recursive", ["false"])[0].lower() in ("1", "true")
                inside = {p: c for p, c in tree.items() if not prefix or p.startswith(prefix + "/")}
                if prefix and not inside:
                    return self._error(404, "EntryNotFound", f"{prefix} does not exist")
                entries, folders = [], set()
                for path_in_repo, content in sorted(inside.items()):
                    rest = path_in_repo[len(prefix) + 1 :] if prefix else path_in_repo
                    if "/" in rest and not recursive:
                        folders.add((prefix + "/" if prefix else "") + rest.split("/")[0])
                        continue
                    entry = {"type": "file", "oid": git_blob_sha1(content), "size": len(content), "path": path_in_repo}
                    if path_in_repo in repo.lfs_paths:
                        digest = hashlib.sha256(content).hexdigest()
                        entry["lfs"] = {"oid": digest, "size": len(content), "pointerSize": 134}
                    entries.append(entry)
                entries += [{"type": "directory", "oid": "0" * 40, "size": 0, "path": f} for f in sorted(folders)]
                self._json(200, entries)

            def _resolve(self, repo_id: str, revision: str, path_in_repo: str, head: bool) -> None:
                repo = self._repo(repo_id, head)
                if repo is None:
                    return
                tree = self._tree(repo, revision, head)
                if tree is None:
                    return
                if path_in_repo not in tree:
                    return self._error(404, "EntryNotFound", f"{path_in_repo} does not exist on {revision}", head)
                content = tree[path_in_repo]
                headers = {"X-Repo-Commit": self._sha(repo, revision), "Accept-Ranges": "bytes",
                           "Content-Type": "application/octet-stream"}  # fmt: skip
                if path_in_repo in repo.lfs_paths:
                    digest = hashlib.sha256(content).hexdigest()
                    headers.update({"ETag": f'"{digest}"', "X-Linked-Etag": f'"{digest}"',
                                    "X-Linked-Size": len(content)})  # fmt: skip
                else:
                    headers["ETag"] = f'"{git_blob_sha1(content)}"'
                status, body = 200, content
                if (ranged := self.headers.get("Range")) and (m := re.fullmatch(r"bytes=(\d+)-(\d*)", ranged)):
                    start = int(m[1])
                    end = int(m[2]) if m[2] else len(content) - 1
                    body = content[start : end + 1]
                    status = 206
                    headers["Content-Range"] = f"bytes {start}-{start + len(body) - 1}/{len(content)}"
                headers["Content-Length"] = len(body)
                self._send(status, body, headers, head=head)

            # --- POST / PUT ---

            def do_PUT(self) -> None:
                if m := re.fullmatch(r"/lfs-upload/([0-9a-f]{64})", self.path):
                    content = self._body()
                    if hashlib.sha256(content).hexdigest() != m[1]:
                        return self._error(400, "BadRequest", "content does not match the oid")
                    hub.lfs_objects[m[1]] = content
                    hub.lfs_uploads.append(m[1])
                    return self._send(200)
                self._error(404, "EntryNotFound", f"no route for PUT {self.path}")

            def do_POST(self) -> None:
                path = urlparse(self.path).path
                body = self._body()
                if path == "/api/repos/create":
                    request = json.loads(body)
                    repo_id = "/".join(x for x in (request.get("organization"), request["name"]) if x)
                    if repo_id in hub.repos:
                        message = "You already created this model repo"
                        return self._json(409, {"error": message, "url": f"{hub.url}/{repo_id}"},
                                          {"X-Error-Message": message})  # fmt: skip
                    private = request.get("visibility", "public") != "public" or bool(request.get("private"))
                    hub.repos[repo_id] = Repo(private=private)
                    hub.commit(repo_id, "main", {".gitattributes": b"*.safetensors filter=lfs diff=lfs merge=lfs\n"},
                               "initial commit")  # fmt: skip
                    return self._json(200, {"url": f"{hub.url}/{repo_id}", "name": repo_id})
                if path == "/api/validate-yaml":
                    return self._json(200, {"errors": [], "warnings": []})
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/branch/([^/]+)", path):
                    repo = self._repo(m[1])
                    if repo is None:
                        return
                    branch = unquote(m[2])
                    if branch in repo.branches:
                        return self._error(409, "Conflict", f"branch {branch} already exists")
                    repo.branches[branch] = dict(repo.branches["main"])
                    repo.heads[branch] = repo.heads["main"]
                    return self._json(200, {})
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/preupload/([^/]+)", path):
                    return self._preupload(m[1], m[2], json.loads(body))
                if m := re.fullmatch(r"/([^/]+/[^/]+)\.git/info/lfs/objects/batch", path):
                    return self._lfs_batch(json.loads(body))
                if m := re.fullmatch(r"/api/models/([^/]+/[^/]+)/commit/([^/]+)", path):
                    return self._commit(m[1], unquote(m[2]), body)
                self._error(404, "EntryNotFound", f"no route for POST {path}")

            def _preupload(self, repo_id: str, revision: str, request: dict) -> None:
                repo = self._repo(repo_id)
                if repo is None:
                    return
                tree = self._tree(repo, revision)
                if tree is None:
                    return
                files = []
                for item in request["files"]:
                    lfs = item["path"].endswith(LFS_SUFFIXES) or item["size"] > 10_000_000
                    entry = {"path": item["path"], "uploadMode": "lfs" if lfs else "regular", "shouldIgnore": False}
                    if item["path"] in tree:
                        content = tree[item["path"]]
                        entry["oid"] = hashlib.sha256(content).hexdigest() if lfs else git_blob_sha1(content)
                    files.append(entry)
                self._json(200, {"files": files, "commitOid": repo.heads.get(unquote(revision))})

            def _lfs_batch(self, request: dict) -> None:
                objects = []
                for item in request["objects"]:
                    entry = {"oid": item["oid"], "size": item["size"]}
                    if item["oid"] not in hub.lfs_objects:
                        entry["actions"] = {"upload": {"href": f"{hub.url}/lfs-upload/{item['oid']}"}}
                    objects.append(entry)
                self._json(200, {"transfer": "basic", "objects": objects},
                           {"Content-Type": "application/vnd.git-lfs+json"})  # fmt: skip

            def _commit(self, repo_id: str, branch: str, body: bytes) -> None:
                repo = self._repo(repo_id)
                if repo is None:
                    return
                if branch not in repo.branches:
                    return self._error(404, "RevisionNotFound", f"Invalid rev id: {branch}")
                message, files = "", {}
                for line in body.decode().splitlines():
                    if not line.strip():
                        continue
                    item = json.loads(line)
                    value = item["value"]
                    if item["key"] == "header":
                        message = value.get("summary", "")
                    elif item["key"] == "file":
                        files[value["path"]] = base64.b64decode(value["content"])
                        repo.lfs_paths.discard(value["path"])
                    elif item["key"] == "lfsFile":
                        if value["oid"] not in hub.lfs_objects:
                            return self._error(400, "BadRequest", f"LFS object {value['oid']} was never uploaded")
                        files[value["path"]] = hub.lfs_objects[value["oid"]]
                        repo.lfs_paths.add(value["path"])
                    elif item["key"] in ("deletedFile", "deletedFolder"):
                        files[value["path"]] = None
                sha = hub.commit(repo_id, branch, files, message)
                self._json(200, {"success": True, "commitOid": sha, "commitUrl": f"{hub.url}/{repo_id}/commit/{sha}",
                                 "commitMessage": message})  # fmt: skip

        return Handler
