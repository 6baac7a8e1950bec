"""IR construction by the primitives and `+`; argument validation at the call site."""

from __future__ import annotations

import json

import pydantic
import pytest

from radixlm.lang import primitives as p
from radixlm.lang.choices import greedy_token_selection, token_length_normalized
from radixlm.lang.errors import UnsupportedFeatureError
from radixlm.lang.ir import ConstantText, ExprList, Gen, RoleBegin, RoleEnd, Select, as_expr, walk


def test_concatenation_flattens_and_wraps_strings():
    e = "Q: " + p.gen("a") + "\n" + p.gen("b")
    assert isinstance(e, ExprList)
    kinds = [type(n).__name__ for n in walk(e)]
    assert kinds == ["ConstantText", "Gen", "ConstantText", "Gen"]
    assert e.exprs[0] == ConstantText("Q: ")


def test_as_expr_rejects_non_strings():
    with pytest.raises(TypeError):
        as_expr(3)
    with pytest.raises(ValueError):
        as_expr(None)


def test_roles_wrap_content():
    e = p.user("hi " + p.gen("x"))
    nodes = list(walk(e))
    assert nodes[0] == RoleBegin("user") and nodes[-1] == RoleEnd("user")
    assert list(walk(p.assistant())) == [RoleBegin("assistant"), RoleEnd("assistant")]
    assert p.system_begin() == RoleBegin("system") and p.user_end() == RoleEnd("user")


def test_gen_params_and_dtype():
    g = p.gen("n", max_tokens=5, stop="\n", temperature=0)
    assert isinstance(g, Gen) and g.params.stop == ("\n",) and g.params.max_new_tokens == 5
    assert p.gen_int("i").params.dtype == "int"
    assert p.gen_string("s").params.dtype == "str"
    assert p.gen("f", dtype=float).params.dtype == "float"
    with pytest.raises(ValueError):
        p.gen("x", dtype=list)


def test_gen_with_choices_is_select():
    s = p.gen("c", choices=["a", "b"])
    assert isinstance(s, Select) and s.choices == ("a", "b") and s.temperature == 0.0
    assert s.choices_method is token_length_normalized
    s2 = p.select("c", ["a"], choices_method="greedy_token_selection")
    assert s2.choices_method is greedy_token_selection
    with pytest.raises(ValueError):
        p.select("c", [])
    with pytest.raises(ValueError):
        p.select("c", ["a"], choices_method="nope")


def test_regex_and_json_schema_validation():
    assert p.gen("r", regex=r"\d+").params.regex == r"\d+"
    with pytest.raises(ValueError):
        p.gen("r", regex="(")
    with pytest.raises(ValueError):
        p.gen("j", json_schema="{not json")

    class City(pydantic.BaseModel):
        name: str
        population: int

    schema = json.loads(p.gen("j", json_schema=City).params.json_schema)
    assert schema["properties"]["population"]["type"] == "integer"
    assert json.loads(p.gen("j", json_schema={"type": "object"}).params.json_schema) == {
        "type": "object"
    }


def test_multimodal_primitives_are_unsupported():
    with pytest.raises(UnsupportedFeatureError, match="multimodal"):
        p.image("cat.png")
    with pytest.raises(NotImplementedError):
        p.video("clip.mp4", 4)


def test_nodes_are_immutable():
    g = p.gen("x")
    with pytest.raises(AttributeError):
        g.name = "y"  # type: ignore[misc]
