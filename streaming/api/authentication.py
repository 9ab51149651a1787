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
from rest_framework.authentication import SessionAuthentication, TokenAuthentication
from rest_framework.exceptions import AuthenticationFailed

from streaming.auth import token_user


class CachedTokenAuthentication(TokenAuthentication):
    def authenticate_credentials(self, key: str) -> tuple[Any, str]:
        user = token_user(key)
        if user is None:
            raise AuthenticationFailed(_("Invalid token."))
        if not user.is_active:
            raise AuthenticationFailed(_("User inactive or deleted."))
        return user, key


class BearerTokenAuthentication(CachedTokenAuthentication):
    keyword = "Bearer"


AUTHENTICATION_CLASSES = [
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
