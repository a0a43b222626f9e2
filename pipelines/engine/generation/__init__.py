"""Generation, owned by the engine: generator specs (``specs``), the run's safety policy
(``safety``), the plan a study hands over (``plan``), loading and stand-ins on the driver
(``loading``), running the plan in one Ray Data execution (``execute``, ``routing``) and its
run-summary rows (``rows``). The names below are the package's public interface."""

from pipelines.engine.generation.execute import generate, generation_budget, generator_pipeline
from pipelines.engine.generation.loading import (StandinChecker, build_standin_generators, check_call_arguments,
                                                 load_generators, load_nsfw_check, standin_checker,
                                                 standin_family)
from pipelines.engine.generation.plan import GenerationPlan, Generated, plan_job, stage_job
from pipelines.engine.generation.rows import generation_rows
from pipelines.engine.generation.safety import SafetySettings, safety_counts, safety_settings, safety_text
from pipelines.engine.generation.specs import (GenerationSettings, GeneratorSpec, generation_settings,
                                               model_defaults, model_id_problem, parse_generator, unknown_standin)

__all__ = ["GeneratorSpec", "GenerationSettings", "SafetySettings", "GenerationPlan", "Generated",
           "generation_settings", "safety_settings", "parse_generator", "model_defaults", "model_id_problem",
           "unknown_standin", "build_standin_generators", "check_call_arguments", "standin_family", "standin_checker",
           "StandinChecker", "load_generators", "load_nsfw_check", "generate", "generation_budget",
           "generator_pipeline", "generation_rows", "plan_job", "stage_job", "safety_counts", "safety_text"]
