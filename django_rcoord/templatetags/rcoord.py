"""``{% load rcoord %}``: guild-member autocomplete in templates."""

from __future__ import annotations

from django import template
from django.utils.safestring import SafeString

from django_rcoord.forms import GuildMemberWidget

register = template.Library()


@register.simple_tag
def guild_member_input(guild: str, name: str, value: str = "", **attrs: str) -> SafeString:
    """An autocomplete input for a member of ``guild``, named ``name``.

    ``{% guild_member_input "knights" "recipient" id="recipient" %}``
    """
    attrs.setdefault("id", f"id_{name}")
    return GuildMemberWidget(guild=guild).render(name, value, attrs)


@register.simple_tag
def rcoord_autocomplete_media() -> SafeString:
    """The widget's script and stylesheet tags: ``{% rcoord_autocomplete_media %}``."""
    return SafeString(str(GuildMemberWidget(guild="-").media))
