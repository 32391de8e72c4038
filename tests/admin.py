"""An admin site of its own (tests/urls.py mounts it at /guild-admin/): a ModelAdmin form
and an inline formset that pick guild members with the autocomplete widget."""

from __future__ import annotations

from django import forms
from django.contrib import admin

from django_rcoord.forms import GuildMemberField
from tests.models import Quest, QuestMember

guild_admin = admin.AdminSite(name="guild_admin")


class QuestForm(forms.ModelForm):
    leader = GuildMemberField(guild="adventurers")

    class Meta:
        model = Quest
        fields = ["title", "leader"]


class QuestMemberForm(forms.ModelForm):
    name = GuildMemberField(guild="adventurers")

    class Meta:
        model = QuestMember
        fields = ["name"]


class QuestMemberInline(admin.TabularInline):
    model = QuestMember
    form = QuestMemberForm
    extra = 0


@admin.register(Quest, site=guild_admin)
class QuestAdmin(admin.ModelAdmin):
    form = QuestForm
    inlines = [QuestMemberInline]
