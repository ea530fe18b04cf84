"""`pipeline.pure.registry`: one way to find a part by name or by import path (pure)."""

from __future__ import annotations

import fractions

import pytest

from pipeline.pure.registry import Registry, UnknownName, is_import_path


class Shape:
    def __init__(self, sides: int = 3, *, name: str = "") -> None:
        self.sides, self.name = sides, name


class Square(Shape):
    def __init__(self, name: str = "") -> None:
        super().__init__(4, name=name)


def shapes() -> Registry[type[Shape]]:
    return Registry("shape", {"triangle": Shape, "square": Square}, base=Shape)


def test_members_are_found_by_name_in_the_order_registered() -> None:
    registry = shapes()
    assert list(registry) == ["triangle", "square"] and len(registry) == 2
    assert registry["square"] is Square and "square" in registry and "circle" not in registry
    assert registry.find("triangle") is Shape
    with pytest.raises(UnknownName, match="unknown shape 'circle'; valid shapes: triangle, square"):
        registry["circle"]
    registry.register("tri", Shape)
    assert registry.find("tri") is Shape
    with pytest.raises(ValueError, match="a shape named 'tri' is registered; pass replace=True"):
        registry.register("tri", Square)
    registry.register("tri", Square, replace=True)
    assert registry["tri"] is Square
    registry.unregister("tri")
    assert "tri" not in registry
    with pytest.raises(ValueError, match="needs a plain name"):
        registry.register("pkg.mod:Thing", Shape)


def test_a_users_class_is_found_by_import_path_and_must_be_one_of_the_kind() -> None:
    registry = shapes()
    path = f"{__name__}:Square"
    assert is_import_path(path) and not is_import_path("square") and not is_import_path("a:b c")
    assert registry.accepts(path) and registry.find(path) is Square
    assert registry.known()[path] is Square and path not in registry  # loaded, not registered
    with pytest.raises(UnknownName, match=f"shape '{__name__}:Registry' is not a subclass of"):
        registry.find(f"{__name__}:Registry")
    with pytest.raises(UnknownName, match="cannot be imported"):
        registry.find("no_such_module_here:Shape")
    names_only = Registry("fraction", {"half": fractions.Fraction(1, 2)})
    assert not names_only.accepts(path)
    with pytest.raises(UnknownName, match="valid fractions: half$"):
        names_only.find(path)


def test_a_member_registered_by_import_path_is_imported_when_first_asked() -> None:
    registry: Registry[type] = Registry("number", {"fraction": "fractions:Fraction"})
    assert "fraction" in registry
    assert registry["fraction"] is fractions.Fraction
    broken: Registry[type] = Registry("number", {"gone": "no_such_module_here:Thing"})
    with pytest.raises(UnknownName, match="number 'no_such_module_here:Thing' cannot be imported"):
        broken["gone"]


def test_members_are_built_with_options_checked_against_what_they_take() -> None:
    registry = shapes()
    assert registry.options_of("triangle") == ("sides", "name")
    assert registry.takes("square", "name") and not registry.takes("square", "sides")
    built = registry.build("triangle", sides=5, name="penta")
    assert isinstance(built, Shape) and (built.sides, built.name) == (5, "penta")
    with pytest.raises(TypeError, match="bad options for shape 'square'.*valid options: name$"):
        registry.build("square", sides=6)
    registry.check_options("triangle", {"name": "x"})  # a part of them: fine
    with pytest.raises(TypeError, match="unexpected keyword argument 'colour'"):
        registry.check_options("triangle", {"colour": "red"})
