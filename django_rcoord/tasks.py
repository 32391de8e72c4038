"""Tasks shipped with django-rcoord. Workers import every installed app's ``tasks`` module."""

from __future__ import annotations

from typing import Any

from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.template.loader import render_to_string

from django_rcoord.queues.registry import PermanentFailure, task


@task(name="rcoord.send_sold_email", queue="email", max_retries=5)
def send_sold_email(seller: str, item: str, price: Any, buyer: str) -> None:
    """E-mail ``seller`` (a username) that ``buyer`` bought ``item`` for ``price``.

    Subject and body come from the templates ``django_rcoord/email/sold_subject.txt``
    and ``sold_body.txt`` (override them in your project). A seller who does not
    exist or has no e-mail address is a dead letter at once; a failure to send
    (SMTP, network) is retried.
    """
    user_model = get_user_model()
    try:
        user = user_model._default_manager.get_by_natural_key(seller)
    except user_model.DoesNotExist:
        raise PermanentFailure(f"no user is named {seller!r}") from None
    address = getattr(user, user_model.get_email_field_name(), "")
    if not address:
        raise PermanentFailure(f"the seller {seller!r} has no e-mail address")
    context = {
        "seller": seller,
        "seller_name": user.get_full_name() if hasattr(user, "get_full_name") else seller,
        "item": item,
        "price": price,
        "buyer": buyer,
    }
    context["seller_name"] = context["seller_name"] or seller
    subject = " ".join(render_to_string("django_rcoord/email/sold_subject.txt", context).split())
    body = render_to_string("django_rcoord/email/sold_body.txt", context)
    send_mail(subject, body, None, [address])
