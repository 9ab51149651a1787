from django.apps import AppConfig


class StreamingConfig(AppConfig):
    name = "streaming"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Streaming chat"
