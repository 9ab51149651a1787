"""Who calls the REST API: API tokens (``Token`` or ``Bearer``, the same DRF tokens the
streams and the OpenAI endpoint take) or the browser's session, whose unsafe requests DRF
checks for the CSRF token.

Token schemes come first so a request without credentials is answered ``401`` with a
``WWW-Authenticate: Token`` challenge (DRF takes it from the first class). Tokens are
resolved through the process's token cache (``streaming.tokens``), with DRF's answers for
an unknown key and for an inactive user.
"""

from __future__ import annotations

from typing import Any

from django.utils.translation import gettext_lazy as _
from drf_spectacular.extensions import OpenApiAuthenticationExtension
from rest_framework.authentication import (
    BaseAuthentication,
    SessionAuthentication,
    TokenAuthentication,
)
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.request import Request

from streaming.auth import INACTIVE, INVALID_HEADER, INVALID_TOKEN, token_from_header, token_user


class NoOtherScheme(BaseAuthentication):
    """An ``Authorization`` header that is no token (another scheme, a third part, two
    headers) is refused as a wrong token, as every other entry point refuses it; DRF's
    token classes pass over a scheme not theirs, and the session behind them took the
    request for the cookie's user."""

    def authenticate(self, request: Request) -> None:
        if token_from_header(request.META.get("HTTP_AUTHORIZATION")) == "":
            raise AuthenticationFailed(_(INVALID_HEADER))
        return None

    def authenticate_header(self, request: Request) -> str:
        return "Token"


class CachedTokenAuthentication(TokenAuthentication):
    def authenticate_credentials(self, key: str) -> tuple[Any, str]:
        user = token_user(key)
        if user is None:
            raise AuthenticationFailed(_(INVALID_TOKEN))
        if not user.is_active:
            raise AuthenticationFailed(_(INACTIVE))
        return user, key


class BearerTokenAuthentication(CachedTokenAuthentication):
    keyword = "Bearer"


AUTHENTICATION_CLASSES = [
    NoOtherScheme,
    CachedTokenAuthentication,
    BearerTokenAuthentication,
    SessionAuthentication,
]


class BearerTokenScheme(OpenApiAuthenticationExtension):
    """The schema's name for ``Bearer`` tokens: DRF's token scheme is ``tokenAuth``, and two
    schemes of one name would leave one of them undescribed."""

    target_class = BearerTokenAuthentication
    name = "bearerAuth"

    def get_security_definition(self, auto_schema: Any) -> dict[str, str]:
        return {
            "type": "http",
            "scheme": "bearer",
            "description": "the same API token as `Authorization: Token <key>`",
        }
