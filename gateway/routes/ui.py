"""The admin dashboard: one static page (plus its script and style) that polls /admin/stats and edits /admin/policy.

A browser cannot send a Bearer header when it opens a page, so ``GET /admin/ui?key=...`` checks the admin key,
stores it in an HttpOnly, SameSite=Strict cookie scoped to /admin and redirects to the bare URL (the key leaves
the address bar); from then on the page and the admin API authenticate with that cookie (``deps.admin_principal``).
"""

from __future__ import annotations

from pathlib import Path

from fastapi import APIRouter, Depends, Request
from fastapi.responses import FileResponse, RedirectResponse, Response

from gateway.deps import ADMIN_COOKIE, admin_principal, get_state
from gateway.errors import NotFoundError
from gateway.state import GatewayState

STATIC_DIR = Path(__file__).resolve().parents[1] / "static"
ASSETS = {"dashboard.css": "text/css; charset=utf-8", "dashboard.js": "text/javascript; charset=utf-8"}
PAGE_HEADERS = {
    "Cache-Control": "no-store",
    "Content-Security-Policy": "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'; form-action 'none'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "no-referrer",
}

router = APIRouter(prefix="/admin", include_in_schema=False)


@router.get("/ui", response_model=None)
async def dashboard(request: Request, key: str | None = None,
                    state: GatewayState = Depends(get_state)) -> FileResponse | RedirectResponse:
    if key is None:
        admin_principal(request, state)
        return FileResponse(STATIC_DIR / "dashboard.html", media_type="text/html; charset=utf-8",
                            headers=PAGE_HEADERS)
    state.auth.authenticate_admin(f"Bearer {key}")  # 401 / 403 before any cookie is set
    response = RedirectResponse("ui", status_code=303, headers={"Cache-Control": "no-store"})
    response.set_cookie(ADMIN_COOKIE, key, path=request.scope.get("root_path", "") + "/admin", httponly=True,
                        samesite="strict", secure=request.url.scheme == "https")
    return response


@router.get("/static/{name}", dependencies=[Depends(admin_principal)])
async def asset(name: str) -> Response:
    if name not in ASSETS:
        raise NotFoundError(f"No dashboard asset named {name!r}.")
    return FileResponse(STATIC_DIR / name, media_type=ASSETS[name], headers=PAGE_HEADERS)
