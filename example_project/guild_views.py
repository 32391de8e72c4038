"""'Mail your guild': pick a recipient among your guild's members with the autocomplete widget."""

from __future__ import annotations

import hashlib
import logging

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.mail import send_mail
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.text import slugify

from django_rcoord.autocomplete import add_update_contact, fetch_autocomplete_list
from django_rcoord.connection.errors import REDIS_UNAVAILABLE
from django_rcoord.forms import GuildMemberField
from django_rcoord.responses import UNAVAILABLE_RETRY_AFTER
from example_project.views import needs_redis

logger = logging.getLogger(__name__)

GUILD = "adventurers"
TEMPLATE = "example/guild_mail.html"


def member_address(name: str) -> str:
    """The demo's address of guild member ``name``: a slug of the name, so it is a valid
    address ("Mateo Durand 545" -> mateo-durand-545@example.com); a name with no Latin
    letter or digit gets one made from its hash."""
    local = slugify(name)[:64].strip("-")
    if not local:
        local = "member-" + hashlib.sha256(name.encode()).hexdigest()[:12]
    return f"{local}@example.com"


class GuildMailForm(forms.Form):
    recipient = GuildMemberField(guild=GUILD, label="To")
    message = forms.CharField(widget=forms.Textarea(attrs={"rows": 3}), max_length=2000)


@login_required
@needs_redis  # a GET with Redis out of reach: the 503 page (the form could not be sent)
def guild_mail(request: HttpRequest) -> HttpResponse:
    sender = request.user.get_username()
    form = GuildMailForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        recipient = form.cleaned_data["recipient"]
        send_mail(
            f"A message from {sender} of the {GUILD}",
            form.cleaned_data["message"],
            None,
            [member_address(recipient)],
        )
        try:
            add_update_contact(sender, recipient)
        except REDIS_UNAVAILABLE as exc:  # the mail went out: a 503 would have it sent twice
            logger.warning("contact of %s not recorded: Redis unavailable: %s", sender, exc)
        messages.success(request, f"Your message to {recipient} is on its way.")
        return redirect("guild-mail")
    if form.has_error("recipient", "unavailable"):
        # Redis went out of reach: the form again, what was typed kept, with the field's
        # error; a 503 (with Retry-After, as the library's) says the fault is not the user's.
        context = {"form": form, "guild": GUILD, "recent": []}  # the recent ones live in Redis
        response = render(request, TEMPLATE, context, status=503)
        response["Retry-After"] = str(UNAVAILABLE_RETRY_AFTER)
        return response
    context = {"form": form, "guild": GUILD, "recent": fetch_autocomplete_list(sender, "")}
    return render(request, TEMPLATE, context)
