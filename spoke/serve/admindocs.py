"""``/docs`` without a CDN: the admin API's OpenAPI description as one static HTML page.

FastAPI's Swagger UI page loads its JavaScript and CSS from a CDN, so it is blank on a
machine without internet access (the usual GPU node). This page is built on the server
from the same OpenAPI document (``/openapi.json``) and needs nothing else.
"""

from __future__ import annotations

import html
import json
from typing import Any

_METHODS = ("get", "post", "put", "patch", "delete")


def render(openapi: dict[str, Any]) -> str:
    """The HTML page for an OpenAPI 3 document: every route with its summary, description,
    request body schema and responses."""
    info = openapi.get("info", {})
    title = html.escape(f"{info.get('title', 'API')} {info.get('version', '')}")
    schemas = openapi.get("components", {}).get("schemas", {})
    parts = [
        "<!doctype html><html><head><meta charset='utf-8'>",
        f"<title>{html.escape(str(info.get('title', 'API')))}</title>",
        "<style>body{font-family:sans-serif;max-width:60em;margin:2em auto}"
        "pre{background:#f4f4f4;padding:.5em;overflow:auto}h2{font-family:monospace}</style>",
        "</head><body>",
        f"<h1>{title}</h1>",
        "<p>Machine-readable: <a href='/openapi.json'>/openapi.json</a>. Routes under "
        "<code>/v1/</code> need <code>Authorization: Bearer &lt;token&gt;</code>; "
        "<code>/metrics</code> needs the node's admin token (not a scoped one): Prometheus "
        "scrapes the tokenless <code>--metrics</code> port.</p>",
    ]
    for path, item in sorted(openapi.get("paths", {}).items()):
        for method in _METHODS:
            op = item.get(method)
            if op is None:
                continue
            parts.append(f"<h2>{method.upper()} {html.escape(path)}</h2>")
            parts.append(f"<p><b>{html.escape(op.get('summary', ''))}</b></p>")
            if op.get("description"):
                parts.append(f"<p>{html.escape(op['description'])}</p>")
            body = op.get("requestBody", {}).get("content", {}).get("application/json")
            if body:
                ref = body.get("schema", {}).get("$ref", "")
                schema = schemas.get(ref.rpartition("/")[2], body.get("schema"))
                parts.append("<p>Request body:</p><pre>")
                parts.append(html.escape(json.dumps(schema, indent=2)))
                parts.append("</pre>")
            responses = ", ".join(
                f"{code} {r.get('description', '')}" for code, r in op.get("responses", {}).items()
            )
            parts.append(f"<p>Responses: {html.escape(responses)}</p>")
    parts.append("</body></html>")
    return "".join(parts)
