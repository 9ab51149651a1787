from django.apps import AppConfig


class StreamingConfig(AppConfig):
    name = "streaming"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Streaming chat"

    def ready(self) -> None:
        """Wire the upward paths: the layers below the services signal, the services act."""
        from streaming import services, signals, titling
        from streaming.conf import streaming_settings

        streaming_settings.check()
        signals.answer_interrupted.connect(
            services.continue_interrupted, dispatch_uid="streaming.auto-continue"
        )
        signals.answer_ended.connect(titling.on_answer_completed, dispatch_uid="streaming.titles")
