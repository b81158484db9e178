import pytest
import torch

from ditgate.sparse.schedule import BudgetSchedule, StepCounter


def test_schedule_gives_the_right_budget_per_step_and_layer():
    s = BudgetSchedule(budget=0.3, dense_steps=2, dense_layers=1, per_step=(1.0, 1.0, 0.5))
    assert s.budget_for(0, 5) == 1.0 and s.budget_for(1, 5) == 1.0
    assert s.budget_for(2, 0) == 1.0  # first layer dense at every step
    assert s.budget_for(2, 3) == 0.5 and s.budget_for(3, 3) == 0.3 and s.budget_for(40, 29) == 0.3
    with pytest.raises(ValueError):
        BudgetSchedule(budget=0.0)


def test_step_counter_counts_steps_across_cfg_pairs_and_generations():
    c = StepCounter()
    seen = []
    for t in (999, 999, 800, 800, 600, 600):  # two forwards per step (classifier-free guidance)
        seen.append(c.observe(torch.tensor([t])))
    assert seen == [0, 0, 1, 1, 2, 2] and c.generation == 0
    assert c.observe(999.0) == 0 and c.generation == 1  # a new pipeline call
    assert c.observe(500.0) == 1


def test_step_counter_reads_the_largest_of_per_token_timesteps():
    """Wan 2.2's TI2V passes one timestep per token, with the conditioning frame's at 0."""
    c = StepCounter()
    steps = [c.observe(torch.tensor([[0.0, 0.0, t, t]])) for t in (900.0, 800.0, 700.0)]
    assert steps == [0, 1, 2] and c.generation == 0


def test_a_timestep_the_counter_cannot_read_leaves_the_step_alone():
    c = StepCounter()
    c.observe_call((), {"timestep": torch.tensor([900.0])}, None)
    for odd in (torch.tensor([]), "soon", [800.0]):
        c.observe_call((), {"timestep": odd}, None)
    assert c.step == 0 and c.generation == 0


def test_step_counter_runs_as_a_hook_on_a_real_denoiser():
    from ditgate.models.presets import get_preset

    preset = get_preset("tiny-wan")
    model = preset.build()
    counter = StepCounter()
    handle = model.register_forward_pre_hook(counter.hook, with_kwargs=True)
    inputs = preset.inputs(model)
    with torch.no_grad():
        for t in (900, 700, 500):
            model(**{**inputs, "timestep": torch.tensor([t])})
    handle.remove()
    assert counter.step == 2


def test_step_counter_finds_the_timestep_where_a_caller_passes_it_by_position():
    from ditgate.models.presets import get_preset
    from ditgate.sparse.schedule import timestep_position

    assert [timestep_position(get_preset(n).build()) for n in ("tiny-wan", "tiny-ltx", "tiny-flux")] == [1, 2, 3]
    model = get_preset("tiny-ltx").build()
    inputs = get_preset("tiny-ltx").inputs(model)
    counter = StepCounter(timestep_position(model))
    handle = model.register_forward_pre_hook(counter.hook, with_kwargs=True)
    rest = {k: v for k, v in inputs.items() if k not in ("hidden_states", "encoder_hidden_states", "timestep")}
    with torch.no_grad():
        for t in (900, 800, 700):  # LTX-Video's timestep is its third argument
            model(inputs["hidden_states"], inputs["encoder_hidden_states"], torch.tensor([t]), **rest)
    handle.remove()
    assert counter.step == 2 and counter.generation == 0
