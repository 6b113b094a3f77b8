"""Clipping: hand-computed values, joint clipping of several arrays, zero norms."""

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from privacy.clipping import clip_arrays, clip_l1, clip_l2, clip_value, joint_norm


def test_l2_clip_scales_onto_the_ball():
    np.testing.assert_allclose(clip_l2(np.array([3.0, 4.0]), 1.0), [0.6, 0.8])


def test_l2_clip_leaves_a_vector_inside_the_ball_unchanged():
    x = np.array([[0.1, -0.2], [0.3, 0.0]])
    np.testing.assert_array_equal(clip_l2(x, 1.0), x)


def test_l1_clip_scales_to_the_l1_bound():
    np.testing.assert_allclose(clip_l1(np.array([1.0, -3.0]), 2.0), [0.5, -1.5])


def test_value_clip_is_rfrec_eq_9():
    np.testing.assert_array_equal(clip_value(np.array([-0.5, 0.1, 0.3]), 0.2), [-0.2, 0.1, 0.2])


@pytest.mark.parametrize("clip", [clip_l2, clip_l1, clip_value])
def test_zero_input_does_not_divide_by_zero(clip):
    with np.errstate(all="raise"):
        out = clip(np.zeros((2, 3)), 1.0)
    np.testing.assert_array_equal(out, np.zeros((2, 3)))


def test_zero_upload_clips_jointly_without_warning():
    with np.errstate(all="raise"):
        out = clip_arrays({"W": np.zeros(3), "Y": np.zeros((2, 2))}, 1.0, "l2")
    assert all(not a.any() for a in out.values())


@pytest.mark.parametrize("bound", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_bound_is_refused_with_its_value(bound):
    with pytest.raises(ValueError, match="clip bound must be a positive finite number"):
        clip_l2(np.ones(2), bound)


def test_joint_clip_bounds_the_concatenation_and_keeps_the_ratio():
    w, y = np.array([[3.0, 0.0]]), np.array([0.0, 4.0, 0.0])
    out = clip_arrays({"W": w, "Y": y}, 1.0, "l2")
    np.testing.assert_allclose(out["W"], w / 5.0)
    np.testing.assert_allclose(out["Y"], y / 5.0)
    assert out["W"].shape == (1, 2)


def test_joint_l1_clip_uses_the_l1_norm_of_the_concatenation():
    out = clip_arrays({"a": np.array([2.0]), "b": np.array([-6.0])}, 4.0, "l1")
    np.testing.assert_allclose(np.concatenate([out["a"], out["b"]]), [1.0, -3.0])


def test_clip_arrays_does_not_mutate_its_input():
    w = np.array([3.0, 4.0])
    clip_arrays({"W": w}, 1.0, "l2")
    np.testing.assert_array_equal(w, [3.0, 4.0])


def test_unknown_norm_is_refused():
    with pytest.raises(ValueError, match="unknown norm 'l3'"):
        joint_norm({"a": np.ones(2)}, "l3")


finite = st.floats(-1e6, 1e6, allow_nan=False)


@settings(max_examples=60, deadline=None)
@given(x=arrays(np.float64, st.integers(1, 20), elements=finite),
       y=arrays(np.float64, st.integers(1, 20), elements=finite),
       bound=st.floats(1e-3, 1e3), norm=st.sampled_from(["l2", "l1", "value"]))
def test_clipped_upload_lies_in_the_ball(x, y, bound, norm):
    out = clip_arrays({"x": x, "y": y}, bound, norm)
    assert joint_norm(out, norm) <= bound * (1 + 1e-12)
    if norm != "value":  # a norm clip only rescales by a factor in (0, 1]: no sign flips
        cat, orig = np.concatenate([out["x"], out["y"]]), np.concatenate([x, y])
        assert np.all(cat * orig >= 0) and np.all(np.abs(cat) <= np.abs(orig))
