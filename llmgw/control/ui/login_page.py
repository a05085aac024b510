"""The login page (``/ui/login``) and the logout form: a session cookie from the API, set in the browser.

The form posts to the API's ``/api/v1/login`` in-process and passes its ``set-cookie`` on; a refused login
is shown in the API's own sentence. A server started ``--insecure`` needs no login, so both go home.
"""

from __future__ import annotations

from starlette.requests import Request
from starlette.responses import RedirectResponse, Response
from starlette.routing import Route

from llmgw.control.auth import credentials
from llmgw.control.ui.common import Ui, read_form


async def login_form(ui: Ui, request: Request) -> Response:
    if await ui.opens_without_login(request):
        # The API refuses every login there ("nothing needs a login"): the form would only loop back here.
        return RedirectResponse(f"{request.scope.get('root_path', '')}/", status_code=303)
    return ui.page(request, "login.html", title="Log in", error="", username="")


async def login(ui: Ui, request: Request) -> Response:
    if await ui.opens_without_login(request):
        return RedirectResponse(f"{request.scope.get('root_path', '')}/", status_code=303)
    form = await read_form(request)
    username, password = form.get("username", ""), form.get("password", "")
    # Not guarded: a refused login is this form's own answer (the API's sentence), not a redirect to itself.
    answer, resp = await ui.call(request, "POST", "/api/v1/login", guarded=False,
                                 json={"username": username, "password": password, "session": True})
    if answer.error:
        return ui.page(request, "login.html", status_code=answer.status, title="Log in",
                       error=answer.error, username=username)
    out = RedirectResponse(f"{request.scope.get('root_path', '')}/", status_code=303)
    for value in resp.headers.get_list("set-cookie"):
        out.headers.append("set-cookie", value)
    return out


async def logout(ui: Ui, request: Request) -> Response:
    _, resp = await ui.call(request, "POST", "/api/v1/logout", guarded=False)
    out = RedirectResponse(f"{request.scope.get('root_path', '')}/login", status_code=303)
    for value in resp.headers.get_list("set-cookie"):
        out.headers.append("set-cookie", value)
    # Cleared whatever the API said: a session already ended must still leave the browser logged out.
    out.delete_cookie(credentials.SESSION_COOKIE, path="/", httponly=True, secure=request.url.scheme == "https",
                      samesite="strict")
    return out


def routes(ui: Ui) -> list[Route]:
    """The login and logout routes, below the UI's mount."""
    return [
        Route("/login", ui.bind(login_form), methods=["GET"]),
        Route("/login", ui.bind(login), methods=["POST"]),
        Route("/logout", ui.bind(logout), methods=["POST"]),
    ]
