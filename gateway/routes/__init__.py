"""HTTP routes, one module per resource; each handler only wires a request to serving/admin code."""

from fastapi import APIRouter

from gateway.routes import admin, chat, completions, health, models, requests, ui


def all_routers() -> list[APIRouter]:
    return [chat.router, completions.router, models.router, requests.router, admin.router, ui.router, health.router]
