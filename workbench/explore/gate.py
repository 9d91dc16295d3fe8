"""Our gate in front of Model Explorer's Flask app: a WSGI middleware wrapped around it inside the server process.

The stock app answers anyone who can reach its port: it reads any file by path, saves uploads, and does not look at
the Host header. The gate lets through only what the viewer needs, and only from whoever holds this session's token:

- the Host header must be our own address and port (``127.0.0.1:P`` or ``localhost:P``): a page on another name that
  resolves to 127.0.0.1 (DNS rebinding) is refused;
- only GET/HEAD, with no request body (uploads and every POST endpoint are off), and a capped query string;
- the page (``/``) and every API call need the session token: in the page URL (``workbench_token=``), or in the
  ``X-Workbench-Token`` header that a small script in the served page adds to the app's own same-origin requests
  (a header, not a cookie: cookies are not sent from an IFrame whose parent page is another site);
- the web app's own static files (the public JS/CSS/fonts inside the wheel, identical for everyone) load without the
  token, because the browser fetches them by absolute path from tags and CSS, where no header can be added;
- file reads (``/api/v1/read_text_file``) are served here, not by the app, and only for regular files under the
  session's own folder (symbolic links resolved first, so a link out of the folder is refused);
- ``/__workbench/health?nonce=N`` answers ``HMAC(token, N)``: the parent learns that the server on the port is the
  one it started, without sending the token to whatever answers there.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import stat
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from workbench.explore.embed import EMBED_SCRIPT

if TYPE_CHECKING:
    from _typeshed.wsgi import WSGIEnvironment

TOKEN_PARAM = "workbench_token"
TOKEN_HEADER = "X-Workbench-Token"
HEALTH_PATH = "/__workbench/health"
READ_TEXT_FILE = "/api/v1/read_text_file"
# the stock app's push channel (page refreshes ordered by its Python API, which we do not use): answered "204 No
# Content", which tells the page's EventSource not to reconnect, instead of holding a server thread per open tab
SERVER_DIRECTOR = "/apistream/server_director"
# the app's own endpoints the viewer calls while it renders our JSON graphs (the rest are refused): extension list,
# version info (answered offline), and a notification that is a no-op without --watch
PASSED_THROUGH = frozenset(
    {"/api/v1/get_extensions", "/api/v1/check_new_version", "/api/v1/notify_user_provided_model_path"}
)
MAX_QUERY_BYTES = 256 * 1024
MAX_READ_BYTES = 1024 * 1024 * 1024

StartResponse = Callable[..., Any]
WsgiApp = Callable[[dict[str, Any], StartResponse], Iterable[bytes]]

_TOKEN_SCRIPT = """<script>(function () {
  var token = %s, header = %s;
  function same(url) { try { return new URL(url, location.href).origin === location.origin; } catch (e) { return false; } }
  var plainFetch = window.fetch.bind(window);
  window.fetch = function (input, init) {
    var url = (typeof Request !== "undefined" && input instanceof Request) ? input.url : String(input);
    if (same(url)) {
      init = Object.assign({}, init || {});
      var headers = new Headers(init.headers || ((input instanceof Request) ? input.headers : undefined));
      headers.set(header, token);
      init.headers = headers;
    }
    return plainFetch(input, init);
  };
  var PlainEventSource = window.EventSource;
  if (PlainEventSource) {
    window.EventSource = function (url, init) {
      if (same(url)) { var withToken = new URL(url, location.href); withToken.searchParams.set(%s, token); url = withToken.toString(); }
      return new PlainEventSource(url, init);
    };
    window.EventSource.prototype = PlainEventSource.prototype;
  }
  var open = XMLHttpRequest.prototype.open, send = XMLHttpRequest.prototype.send;
  XMLHttpRequest.prototype.open = function (method, url) { this.__workbenchSame = same(url); return open.apply(this, arguments); };
  XMLHttpRequest.prototype.send = function () { if (this.__workbenchSame) { this.setRequestHeader(header, token); } return send.apply(this, arguments); };
})();</script>"""


def health_answer(token: str, nonce: str) -> str:
    """What our server answers to a health challenge: only a holder of the token can compute it."""
    return hmac.new(
        token.encode("ascii"), b"workbench-explore-health\0" + nonce.encode("ascii"), hashlib.sha256
    ).hexdigest()


def static_files(web_app_dir: Path) -> frozenset[str]:
    """URL paths of the web app's static files (``/main-X.js``, ``/static_files/...``), without index.html."""
    found = set()
    for folder, _dirs, files in os.walk(web_app_dir, followlinks=False):
        for name in files:
            path = Path(folder) / name
            if path.is_symlink():
                continue
            relative = path.relative_to(web_app_dir).as_posix()
            if relative != "index.html":
                found.add("/" + relative)
    return frozenset(found)


class ExplorerGate:
    """WSGI middleware: refuses every request the viewer does not need, or that does not carry the session token."""

    def __init__(self, app: WsgiApp, *, token: str, root: Path, web_app_dir: Path, port: int = 0) -> None:
        if len(token) < 32:
            raise ValueError("the session token must be at least 32 characters")
        self.app = app
        self.token = token
        self.root = Path(os.path.realpath(root))
        self.port = port
        self.static = static_files(web_app_dir)
        index = (web_app_dir / "index.html").read_text(encoding="utf-8")
        script = _TOKEN_SCRIPT % (json.dumps(token), json.dumps(TOKEN_HEADER), json.dumps(TOKEN_PARAM))
        # first thing in <head>: the app's scripts (loaded after it) see the wrapped fetch; the explorer's embed
        # script (info panels collapsed inside an IFrame) last
        index = index.replace("<head>", "<head>" + script, 1).replace("</head>", EMBED_SCRIPT + "</head>", 1)
        self.index = index.encode("utf-8")

    # --- helpers -----------------------------------------------------------------------------------------------

    def allowed_hosts(self) -> frozenset[str]:
        return frozenset({f"127.0.0.1:{self.port}", f"localhost:{self.port}"})

    def _respond(
        self, start_response: StartResponse, status: str, body: bytes, content_type: str = "text/plain; charset=utf-8"
    ) -> list[bytes]:
        start_response(
            status,
            [
                ("Content-Type", content_type),
                ("Content-Length", str(len(body))),
                ("Cache-Control", "no-store"),
                ("Referrer-Policy", "same-origin"),
                ("X-Content-Type-Options", "nosniff"),
            ],
        )
        return [body]

    def _refuse(self, environ: WSGIEnvironment, start_response: StartResponse, status: str, why: str) -> list[bytes]:
        # the server log shows what was refused (method and path only: a query may hold the token)
        print(
            f"workbench gate refused {status} {environ.get('REQUEST_METHOD')} {environ.get('PATH_INFO')!r}: {why}",
            flush=True,
        )
        return self._respond(start_response, status, f"refused by the workbench explorer gate: {why}\n".encode())

    def _token_ok(self, environ: WSGIEnvironment, query: dict[str, list[str]]) -> bool:
        given = environ.get("HTTP_" + TOKEN_HEADER.upper().replace("-", "_")) or (query.get(TOKEN_PARAM) or [""])[0]
        return hmac.compare_digest(given.encode("utf-8", "replace"), self.token.encode("ascii"))

    def _read_text_file(self, start_response: StartResponse, query: dict[str, list[str]]) -> list[bytes]:
        """The app's file read, confined to the session folder; same JSON shape as the app's ({content} / {error})."""
        requested = (query.get("path") or [""])[0]
        real = Path(os.path.realpath(os.path.expanduser(requested))) if requested else None
        if real is None or real == self.root or self.root not in real.parents:
            body = json.dumps({"error": "reading files outside this explorer session's folder is refused"})
            return self._respond(start_response, "403 Forbidden", body.encode(), "application/json")
        try:
            fd = os.open(real, os.O_RDONLY | os.O_NOFOLLOW | getattr(os, "O_NONBLOCK", 0))
        except OSError as error:
            body = json.dumps({"error": f"cannot open {real.name}: {error.strerror}"})
            return self._respond(start_response, "404 Not Found", body.encode(), "application/json")
        with os.fdopen(fd, "rb") as handle:
            info = os.fstat(handle.fileno())
            if not stat.S_ISREG(info.st_mode) or info.st_size > MAX_READ_BYTES:
                body = json.dumps({"error": f"{real.name} is not a regular file below {MAX_READ_BYTES} bytes"})
                return self._respond(start_response, "403 Forbidden", body.encode(), "application/json")
            data = handle.read(MAX_READ_BYTES + 1)
        try:
            body = json.dumps({"content": data.decode("utf-8")})
        except UnicodeDecodeError:
            body = json.dumps({"error": f"{real.name} is not UTF-8 text"})
        return self._respond(start_response, "200 OK", body.encode(), "application/json")

    # --- WSGI ----------------------------------------------------------------------------------------------------

    def __call__(self, environ: WSGIEnvironment, start_response: StartResponse) -> Iterable[bytes]:
        from urllib.parse import parse_qs

        method = environ.get("REQUEST_METHOD", "")
        path = environ.get("PATH_INFO", "")
        if environ.get("HTTP_HOST", "") not in self.allowed_hosts():
            return self._refuse(
                environ, start_response, "403 Forbidden", "the Host header is not this server's address"
            )
        raw_query = environ.get("QUERY_STRING", "")
        if len(raw_query) > MAX_QUERY_BYTES:
            return self._refuse(environ, start_response, "414 URI Too Long", f"query above {MAX_QUERY_BYTES} bytes")
        if method not in ("GET", "HEAD"):
            return self._refuse(
                environ, start_response, "405 Method Not Allowed", "only GET and HEAD (uploads are off)"
            )
        length = environ.get("CONTENT_LENGTH") or "0"
        if environ.get("HTTP_TRANSFER_ENCODING") or not length.isdigit() or int(length) > 0:
            return self._refuse(environ, start_response, "413 Content Too Large", "requests carry no body here")
        query = parse_qs(raw_query, keep_blank_values=True)
        if path == HEALTH_PATH:
            nonce = (query.get("nonce") or [""])[0]
            if not (16 <= len(nonce) <= 128 and nonce.isalnum() and nonce.isascii()):
                return self._refuse(environ, start_response, "400 Bad Request", "nonce: 16-128 letters or digits")
            return self._respond(start_response, "200 OK", health_answer(self.token, nonce).encode())
        if path in self.static:
            return self.app(environ, start_response)
        if not self._token_ok(environ, query):
            return self._refuse(environ, start_response, "403 Forbidden", "no valid session token")
        if path == "/":
            return self._respond(start_response, "200 OK", self.index, "text/html; charset=utf-8")
        if path == READ_TEXT_FILE:
            return self._read_text_file(start_response, query)
        if path == SERVER_DIRECTOR:
            start_response("204 No Content", [("Cache-Control", "no-store")])
            return []
        if path in PASSED_THROUGH:
            return self.app(environ, start_response)
        return self._refuse(environ, start_response, "404 Not Found", "not an endpoint the viewer needs")
