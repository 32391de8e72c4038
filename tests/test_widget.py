from __future__ import annotations

import pytest
from django import forms
from django.template import Context, Template

from django_rcoord.autocomplete import join_guild
from django_rcoord.forms import GuildMemberField, GuildMemberWidget


class MailForm(forms.Form):
    first = GuildMemberField(guild="knights")
    second = GuildMemberField(guild="knights", required=False)


def test_field_checks_the_value_against_the_index() -> None:
    join_guild("knights", "Émile")
    assert MailForm({"first": "Émile"}).is_valid()
    form = MailForm({"first": "émile"})  # a suggestion must be picked as spelled
    assert not form.is_valid()
    assert form.errors["first"] == ["émile is not a member of knights."]
    assert not MailForm({"first": "Mallory"}).is_valid()


def test_widget_renders_an_aria_combobox_with_its_listbox_and_live_region() -> None:
    html = str(MailForm()["first"])
    assert 'role="combobox"' in html
    assert 'aria-autocomplete="list"' in html
    assert 'aria-expanded="false"' in html
    assert 'aria-controls="id_first-listbox"' in html
    assert 'role="listbox" id="id_first-listbox"' in html
    assert "<ul" not in html
    assert 'aria-live="polite"' in html
    assert 'data-rcoord-autocomplete="/example/rcoord/guilds/knights/members/"' in html
    # Two widgets on one page keep apart.
    assert 'id="id_second-listbox"' in str(MailForm()["second"])


def test_media_is_local_static_files() -> None:
    media = str(GuildMemberWidget(guild="x").media)
    assert "django_rcoord/autocomplete.js" in media
    assert "django_rcoord/autocomplete.css" in media
    assert "http" not in media


def test_template_tags() -> None:
    rendered = Template(
        '{% load rcoord %}{% rcoord_autocomplete_media %}{% guild_member_input "knights" "to" %}'
    ).render(Context())
    assert "autocomplete.js" in rendered
    assert 'name="to"' in rendered
    assert 'role="combobox"' in rendered
    assert 'id="id_to-listbox"' in rendered


@pytest.mark.django_db
def test_guild_mail_page_validates_on_the_server(client, django_user_model, mailoutbox) -> None:
    from django_rcoord.autocomplete import fetch_autocomplete_list

    user = django_user_model.objects.create_user("ada", password="pw")
    join_guild("adventurers", "Zoë")
    client.force_login(user)
    refused = client.post("/example/guild-mail/", {"recipient": "Nobody", "message": "hi"})
    assert "Nobody is not a member of adventurers." in refused.content.decode()
    client.post("/example/guild-mail/", {"recipient": "Zoë", "message": "hi"})
    assert mailoutbox[0].to == ["zoe@example.com"]
    assert fetch_autocomplete_list("ada", "z") == ["Zoë"]
