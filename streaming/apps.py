from django.apps import AppConfig


class StreamingConfig(AppConfig):
    name = "streaming"
    default_auto_field = "django.db.models.BigAutoField"
    verbose_name = "Streaming chat"

    def ready(self) -> None:
        """Wire the upward paths: the layers below the services signal, the services act."""
        from django.contrib.auth import get_user_model
        from django.contrib.auth.signals import user_logged_out
        from django.db.models.signals import post_delete, post_save, pre_save
        from rest_framework.authtoken.models import Token, TokenProxy

        from streaming import services, signals, titling, tokens
        from streaming.conf import streaming_settings
        from streaming.runtime import get_runtime

        streaming_settings.check()
        signals.answer_interrupted.connect(
            services.continue_interrupted, dispatch_uid="streaming.auto-continue"
        )
        signals.answer_ended.connect(titling.on_answer_completed, dispatch_uid="streaming.titles")
        # A cached token must not outlive its row or its user's rights (streaming.tokens).
        post_delete.connect(tokens.token_deleted, sender=Token, dispatch_uid="streaming.token")
        # The admin saves tokens as DRF's proxy model, which is a sender of its own.
        for model in (Token, TokenProxy):
            uid = f"streaming.{model.__name__}"
            pre_save.connect(tokens.token_saving, sender=model, dispatch_uid=f"{uid}-saving")
            post_save.connect(tokens.token_saved, sender=model, dispatch_uid=f"{uid}-saved")
        user = get_user_model()
        post_save.connect(tokens.user_changed, sender=user, dispatch_uid="streaming.user-saved")
        post_delete.connect(tokens.user_changed, sender=user, dispatch_uid="streaming.user-gone")
        user_logged_out.connect(tokens.logged_out, dispatch_uid="streaming.logout")
        tokens.cache().broadcast = lambda user_id: get_runtime().revoke_tokens(user_id)
