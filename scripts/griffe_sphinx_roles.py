"""A griffe extension for the docs build (mkdocs.yml): Sphinx roles as Markdown.

The docstrings name other objects with Sphinx roles (:class:`Identity`,
:meth:`Lineage.terminate`), which read well in ``help()`` and in an editor but
which mkdocstrings prints as raw text. Here each role becomes inline code, and
a link (an mkdocstrings cross-reference) where it names an object that the API
reference renders: a public name of ``proctable`` listed in docs/api.md, or a
public member of one, looked up as written, then beside the docstring's class.
tests/test_docs.py builds the site and fails on any role left as text.
"""

from __future__ import annotations

import pathlib
import re
from typing import Any, Optional

import griffe

ROOT = pathlib.Path(__file__).resolve().parent.parent
API_PAGE = ROOT / "docs" / "api.md"
PACKAGE = "proctable"

_ROLE = re.compile(r":(?:py:)?(class|func|meth|attr|exc|data|mod|obj):`([^`]+)`")
_CALLABLE = ("func", "meth")


class SphinxRoles(griffe.Extension):
    """Rewrite the roles of every docstring of the package once it is loaded."""

    def on_package(self, *, pkg: griffe.Module, **kwargs: Any) -> None:
        if pkg.name != PACKAGE:
            return
        shown = re.findall(rf"^:::\s*({PACKAGE}\.\w+)\s*$", API_PAGE.read_text(), re.M)
        self.anchors: set[str] = set()
        self.public: dict[str, str] = {}  # canonical path -> the reference's id
        for ident in shown:
            obj = _target(pkg.get_member(ident.split(".", 1)[1]))
            self.anchors.add(ident)
            if obj is None:
                continue
            self.public[obj.path] = ident
            for name, member in obj.members.items():
                if not name.startswith("_") and not member.is_alias:
                    self.anchors.add(f"{ident}.{name}")
        self._walk(pkg)

    def _walk(self, obj: griffe.Object) -> None:
        if obj.docstring is not None:
            obj.docstring.value = _ROLE.sub(lambda m: self._render(obj, m), obj.docstring.value)
        for member in obj.members.values():
            if not member.is_alias:
                self._walk(member)  # type: ignore[arg-type]

    def _render(self, where: griffe.Object, m: re.Match[str]) -> str:
        kind, text = m.group(1), m.group(2).strip()
        if "<" in text and text.endswith(">"):  # :role:`title <target>`
            title, target = text[:-1].split("<", 1)
            title = title.strip()
        else:
            target, title = text, ""
        target = target.strip().lstrip("~").lstrip(".").removesuffix("()")
        if not title:
            title = target.rsplit(".", 1)[-1] if text.startswith("~") else target
            if kind in _CALLABLE:
                title += "()"
        ident = self._resolve(where, target, kind) if kind != "mod" else None
        code = f"`{title}`"
        return f"[{code}][{ident}]" if ident is not None else code

    def _resolve(self, where: griffe.Object, target: str, kind: str) -> Optional[str]:
        """The reference's id of target as named in where's docstring, or None."""
        bare = target.removeprefix(f"{PACKAGE}.")
        tries = [f"{PACKAGE}.{bare}"]
        # a member named beside the docstring: of its class, or of the class itself
        # (first, for a method or attribute, as Sphinx looks)
        owner = where if where.is_class else where.parent
        if owner is not None and owner.is_class:
            ident = self.public.get(owner.path)
            if ident is not None:
                tries.insert(1 if kind not in ("meth", "attr") else 0, f"{ident}.{bare}")
        # a name of the module the docstring is in, that the reference shows publicly
        module = where.module
        tries.append(self.public.get(f"{module.path}.{bare}", ""))
        return next((t for t in tries if t in self.anchors), None)


def _target(obj: Any) -> Optional[griffe.Object]:
    try:
        return obj.final_target if obj.is_alias else obj  # type: ignore[no-any-return]
    except (griffe.AliasResolutionError, griffe.CyclicAliasError):
        return None
