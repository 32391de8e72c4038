"""Form widget and field for picking a guild member, with accessible autocomplete."""

from __future__ import annotations

import logging
from typing import Any

from django import forms
from django.urls import reverse
from django.utils.translation import gettext_lazy as _

from django_rcoord.autocomplete import is_guild_member
from django_rcoord.connection.errors import NO_REDIS

logger = logging.getLogger(__name__)


class GuildMemberWidget(forms.TextInput):
    """A text input that suggests members of ``guild`` as you type (WAI-ARIA combobox).

    Plain JavaScript and CSS come through ``Media``; without JavaScript it is a
    plain text input (the field validates the value on the server).
    """

    template_name = "django_rcoord/widgets/guild_member.html"

    class Media:
        css = {"all": ["django_rcoord/autocomplete.css"]}
        js = ["django_rcoord/autocomplete.js"]

    def __init__(self, guild: str, attrs: dict[str, Any] | None = None, limit: int = 10) -> None:
        super().__init__(attrs)
        self.guild = guild
        self.limit = limit

    def get_context(self, name: str, value: Any, attrs: dict[str, Any] | None) -> dict[str, Any]:
        context = super().get_context(name, value, attrs)
        widget_attrs = context["widget"]["attrs"]
        widget_attrs.update(
            {
                "role": "combobox",
                "aria-autocomplete": "list",
                "aria-expanded": "false",
                "autocomplete": "off",
                "spellcheck": "false",
                "data-rcoord-autocomplete": reverse("rcoord:guild-members", args=[self.guild]),
                "data-rcoord-limit": str(self.limit),
            }
        )
        if widget_attrs.get("id"):
            widget_attrs["aria-controls"] = f"{widget_attrs['id']}-listbox"
        return context


class GuildMemberField(forms.CharField):
    """A member of ``guild``: the submitted name is checked against the guild's index.

    When Redis cannot be reached the value cannot be checked: the field is invalid with
    the code ``"unavailable"`` (the form is shown again, what was typed kept), never a 500;
    a view that prefers a 503 asks ``form.has_error(name, "unavailable")``.
    """

    default_error_messages = {
        "not_member": _("%(value)s is not a member of %(guild)s."),
        "unavailable": _("Members of %(guild)s cannot be checked right now; try again shortly."),
    }

    def __init__(self, guild: str, **kwargs: Any) -> None:
        self.guild = guild
        kwargs.setdefault("widget", GuildMemberWidget(guild=guild))
        kwargs.setdefault("max_length", 150)
        super().__init__(**kwargs)

    def validate(self, value: str) -> None:
        super().validate(value)
        if not value:
            return
        try:
            member = is_guild_member(self.guild, value)
        except NO_REDIS as exc:
            logger.error("Members of %r not checked: Redis unavailable: %s", self.guild, exc)
            raise forms.ValidationError(
                self.error_messages["unavailable"],
                code="unavailable",
                params={"value": value, "guild": self.guild},
            ) from exc
        if not member:
            raise forms.ValidationError(
                self.error_messages["not_member"],
                code="not_member",
                params={"value": value, "guild": self.guild},
            )
