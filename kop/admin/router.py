"""The admin API's router: (HTTP method, path template) -> handler, matched segment by segment.

Templates look like Pulsar's, `/admin/v2/namespaces/{tenant}/{namespace}/deduplication`; a `{name}` segment matches
one percent-decoded path segment and reaches the handler as a keyword argument. A path that matches a template under
another method answers 405, one that matches nothing 404; a template registered twice is refused.
"""
from collections.abc import Awaitable, Callable
from dataclasses import dataclass

from kop.admin.http import HttpError, Request, Response, path_segments

RouteHandler = Callable[..., Awaitable[Response]]


@dataclass(frozen=True, slots=True)
class Route:
    method: str
    template: tuple[str, ...]
    handler: RouteHandler

    def match(self, segments: list[str]) -> dict[str, str] | None:
        if len(segments) != len(self.template):
            return None
        params: dict[str, str] = {}
        for part, segment in zip(self.template, segments):
            if part.startswith("{") and part.endswith("}"):
                if not segment:
                    return None
                params[part[1:-1]] = segment
            elif part != segment:
                return None
        return params


class AdminRouter:
    def __init__(self) -> None:
        self._routes: list[Route] = []

    def add(self, method: str, template: str, handler: RouteHandler) -> None:
        parts = tuple(template.strip("/").split("/"))
        method = method.upper()
        for route in self._routes:
            if route.method == method and route.template == parts:
                raise ValueError(f"route {method} {template} is already registered")
        self._routes.append(Route(method, parts, handler))

    async def __call__(self, request: Request) -> Response:
        segments = path_segments(request.path)
        allowed = []
        for route in self._routes:
            params = route.match(segments)
            if params is None:
                continue
            if route.method == request.method or (request.method == "HEAD" and route.method == "GET"):
                return await route.handler(request, **params)
            allowed.append(route.method)
        if allowed:
            raise HttpError(405, f"method {request.method} not allowed here; use {', '.join(sorted(set(allowed)))}")
        raise HttpError(404, f"no such resource: {request.path}")
