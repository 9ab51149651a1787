"""Create the demo user on first run and print how to log in (``make run``)."""

from __future__ import annotations

import secrets
from typing import Any

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand
from rest_framework.authtoken.models import Token


class Command(BaseCommand):
    help = "Create the demo user (first run only) and print its credentials."

    def add_arguments(self, parser: Any) -> None:
        parser.add_argument("--username", default="demo")
        parser.add_argument(
            "--url", default="http://127.0.0.1:8000/", help="where the server will listen"
        )

    def handle(self, *args: Any, username: str, url: str, **options: Any) -> None:
        User = get_user_model()
        if User.objects.filter(username=username).exists():
            user = User.objects.get(username=username)
            token, _ = Token.objects.get_or_create(user=user)
            self.stdout.write(f"Demo user '{username}' exists. API token: {token.key}")
            return
        password = secrets.token_urlsafe(12)
        user = User.objects.create_user(
            username, password=password, is_staff=True, is_superuser=True
        )
        token = Token.objects.create(user=user)
        self.stdout.write(
            "Created the demo user (also an admin):\n"
            f"  username: {username}\n  password: {password}\n  API token: {token.key}\n"
            f"Open {url} and log in; the admin is at {url.rstrip('/')}/admin/."
        )
