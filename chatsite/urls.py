from django.contrib import admin
from django.contrib.auth import views as auth_views
from django.urls import include, path

from streaming import health, pages
from streaming.api import docs

urlpatterns = [
    path("admin/", admin.site.urls),
    path("accounts/login/", auth_views.LoginView.as_view(), name="login"),
    path("accounts/logout/", auth_views.LogoutView.as_view(), name="logout"),
    path("api/schema/", docs.schema, name="schema"),
    path("api/docs/", docs.swagger, name="docs"),
    path("api/redoc/", docs.redoc, name="redoc"),
    path("api/", include("streaming.urls")),
    path("healthz", health.healthz, name="healthz"),
    path("readyz", health.readyz, name="readyz"),
    path("", pages.chat, name="chat"),
    path("", include("django_prometheus.urls")),
]

# JSON errors under /api/ and /v1/ (streaming.errors shape); Django's pages elsewhere.
handler400 = "streaming.api.errors.bad_request"
handler403 = "streaming.api.errors.permission_denied"
handler404 = "streaming.api.errors.page_not_found"
handler500 = "streaming.api.errors.server_error"
