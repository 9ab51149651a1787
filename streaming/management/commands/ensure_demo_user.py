"""Create the demo user on first run and print how to log in (``make run``); set a new
password for it on request (``make demo-password``): passwords are stored hashed, so a
later run cannot show the first one."""

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
            "--reset-password",
            action="store_true",
            help="give the (existing or new) demo user a new password and print it",
        )

    def handle(self, *args: Any, username: str, reset_password: bool, **options: Any) -> None:
        User = get_user_model()
        user = User.objects.filter(username=username).first()
        if user is not None and not reset_password:
            token, _ = Token.objects.get_or_create(user=user)
            self.stdout.write(
                f"Demo user '{username}' exists (its password was printed on the first run; "
                f"`make demo-password` sets a new one). API token: {token.key}"
            )
            return
        password = secrets.token_urlsafe(12)
        if user is None:
            user = User.objects.create_user(
                username, password=password, is_staff=True, is_superuser=True
            )
            self.stdout.write("Created the demo user (also an admin):")
        else:
            user.set_password(password)
            user.save(update_fields=["password"])
            self.stdout.write("New password for the demo user:")
        token, _ = Token.objects.get_or_create(user=user)
        self.stdout.write(
            f"  username: {username}\n  password: {password}\n  API token: {token.key}"
        )
