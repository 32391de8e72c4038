"""Demos of the semaphore middleware and the rate-limit counters."""

from __future__ import annotations

import secrets
import time

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.mail import send_mail
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from django_rcoord.ratelimit import hit
from example_project.guild_views import member_address
from example_project.views import needs_redis

CODE_INTERVAL = 60  # seconds between verification codes, per user


@login_required
@needs_redis
def verification_code(request: HttpRequest) -> HttpResponse:
    """Send a one-time code by e-mail, at most once a minute per user."""
    status = 200
    if request.method == "POST":
        attempt = hit(f"verification-code:{request.user.pk}", 1, CODE_INTERVAL)
        if attempt.allowed:
            code = f"{secrets.randbelow(10**6):06d}"
            send_mail(
                "Your verification code",
                f"Your code is {code}.",
                None,
                # A custom user model need not have an e-mail field.
                [getattr(request.user, "email", "") or member_address(request.user.get_username())],
            )
            messages.success(request, "A code is on its way to your inbox.")
        else:
            status = 429
            messages.error(
                request,
                f"One code a minute: try again in {int(attempt.retry_after) + 1} seconds.",
            )
    return render(request, "example/verification_code.html", status=status)


def slow_report(request: HttpRequest) -> HttpResponse:
    """Three seconds of work; ConcurrencyLimitMiddleware lets two run at once, site-wide."""
    time.sleep(3)
    return render(request, "example/slow_report.html")
