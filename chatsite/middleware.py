"""The middleware stack, marked synchronous-only.

Every Django view here is synchronous (DRF, the admin, the pages). Under ASGI, Django runs
middleware that can be async on the event loop, and a ``MiddlewareMixin`` then hops to the
request's thread for each of its hooks: about fifteen thread switches per request. Marked
synchronous-only, the whole stack and the view run in that thread, entered once
(docs/performance.md has the figures).

Streams never pass through here: they are Channels consumers, routed before Django.
"""

from __future__ import annotations

from typing import Any

from django.contrib.auth.middleware import AuthenticationMiddleware as _Authentication
from django.contrib.messages.middleware import MessageMiddleware as _Message
from django.contrib.sessions.middleware import SessionMiddleware as _Session
from django.middleware.clickjacking import XFrameOptionsMiddleware as _XFrameOptions
from django.middleware.common import CommonMiddleware as _Common
from django.middleware.csrf import CsrfViewMiddleware as _CsrfView
from django.middleware.security import SecurityMiddleware as _Security
from django.utils.decorators import sync_only_middleware
from django_prometheus.middleware import PrometheusAfterMiddleware as _PrometheusAfter
from django_prometheus.middleware import PrometheusBeforeMiddleware as _PrometheusBefore
from whitenoise.middleware import WhiteNoiseMiddleware as _WhiteNoise

from streaming.api.errors import JSON_PREFIXES


def _sync_only(middleware: type) -> Any:
    named = {"__module__": __name__, "__doc__": middleware.__doc__}
    return sync_only_middleware(type(middleware.__name__, (middleware,), named))


PrometheusBeforeMiddleware = _sync_only(_PrometheusBefore)
SecurityMiddleware = _sync_only(_Security)
WhiteNoiseMiddleware = _sync_only(_WhiteNoise)
SessionMiddleware = _sync_only(_Session)


class _CommonWithoutAPIRedirects(_Common):
    """No redirect to the URL with a slash under ``/api/`` and ``/v1/``: a client follows
    a 301 with a GET, so a POST would lose its method and body on the way (Django's debug
    mode raises instead). The JSON 404 names the URL with the slash."""

    def should_redirect_with_slash(self, request: Any) -> bool:
        if request.path_info.startswith(JSON_PREFIXES):
            return False
        return bool(super().should_redirect_with_slash(request))


CommonMiddleware = _sync_only(_CommonWithoutAPIRedirects)
CsrfViewMiddleware = _sync_only(_CsrfView)
AuthenticationMiddleware = _sync_only(_Authentication)
MessageMiddleware = _sync_only(_Message)
XFrameOptionsMiddleware = _sync_only(_XFrameOptions)


class _BoundedPrometheusAfter(_PrometheusAfter):
    """django-prometheus with every ``method`` label bounded: it labels request latency by
    the raw method, so each made-up method a client sends (``FOO``, ``X1``...) was a new
    time series, forever (2,000 requests grew /metrics from 95 KB to 4.3 MB)."""

    def label_metric(self, metric: Any, request: Any, response: Any = None, **labels: Any) -> Any:
        if "method" in labels:
            labels["method"] = self._method(request)
        return super().label_metric(metric, request, response, **labels)


PrometheusAfterMiddleware = _sync_only(_BoundedPrometheusAfter)
