"""Who calls the REST API: API tokens (``Token`` or ``Bearer``, the same DRF tokens the
streams and the OpenAI endpoint take) or the browser's session, whose unsafe requests DRF
checks for the CSRF token.

Token schemes come first so a request without credentials is answered ``401`` with a
``WWW-Authenticate: Token`` challenge (DRF takes it from the first class).
"""

from __future__ import annotations

from rest_framework.authentication import SessionAuthentication, TokenAuthentication


class BearerTokenAuthentication(TokenAuthentication):
    keyword = "Bearer"


AUTHENTICATION_CLASSES = [TokenAuthentication, BearerTokenAuthentication, SessionAuthentication]
