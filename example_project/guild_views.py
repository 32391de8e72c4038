"""'Mail your guild': pick a recipient among your guild's members with the autocomplete widget."""

from __future__ import annotations

import hashlib

from django import forms
from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.core.mail import send_mail
from django.http import HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.utils.text import slugify

from django_rcoord.autocomplete import add_update_contact, fetch_autocomplete_list
from django_rcoord.forms import GuildMemberField

GUILD = "adventurers"


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
        add_update_contact(sender, recipient)
        messages.success(request, f"Your message to {recipient} is on its way.")
        return redirect("guild-mail")
    context = {
        "form": form,
        "guild": GUILD,
        "recent": fetch_autocomplete_list(sender, ""),
    }
    return render(request, "example/guild_mail.html", context)
