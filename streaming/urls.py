from django.urls import path

from streaming.api import views

app_name = "streaming"

urlpatterns = [
    path("conversations/", views.ConversationList.as_view(), name="conversations"),
    path(
        "conversations/<uuid:conversation_id>/",
        views.ConversationDetail.as_view(),
        name="conversation",
    ),
    path(
        "conversations/<uuid:conversation_id>/messages/",
        views.ConversationMessages.as_view(),
        name="messages",
    ),
    path("messages/", views.NewConversationMessages.as_view(), name="new_conversation"),
    path("messages/<uuid:message_id>/", views.MessageDetail.as_view(), name="message"),
    path("messages/<uuid:message_id>/cancel/", views.MessageCancel.as_view(), name="cancel"),
    path("messages/<uuid:message_id>/continue/", views.MessageContinue.as_view(), name="continue"),
    path(
        "messages/<uuid:message_id>/regenerate/",
        views.MessageRegenerate.as_view(),
        name="regenerate",
    ),
    path("messages/<uuid:message_id>/edit/", views.MessageEdit.as_view(), name="edit"),
]
