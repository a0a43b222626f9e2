"""Generation prompts of paper 002 (Table 1) with the correct indefinite article."""

from __future__ import annotations

from schemas.occupations import indefinite_article

def render(template: str, occupation) -> str:
    """Fill a Table 1 template ("A photo of {article} {occupation} smiling") for an Occupation."""
    shown = occupation.prompt_name or occupation.name
    article = occupation.article or indefinite_article(shown)
    return template.format(article=article, occupation=shown)


def prompt_table(occupations, templates) -> dict[str, list[str]]:
    """occupation name -> its prompts, in template order (prompt_id = position + 1)."""
    if not templates:
        raise ValueError("no prompt templates configured")
    for t in templates:
        if "{occupation}" not in t:
            raise ValueError(f"prompt template {t!r} has no {{occupation}} placeholder")
    return {o.name: [render(t, o) for t in templates] for o in occupations}
