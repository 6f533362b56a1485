"""SmartSearch (RUC-NLPIR/SmartSearch), the whole method: the usefulness judge and redundancy rule per search round,
query refinement with regeneration from the refined prefix, and the SFT -> DPO -> GRPO curriculum.

Modules: ``config`` (preset model, a leaf), ``endpoint`` (OpenAI-compatible client, our server as judge),
``judge`` (per-round verdicts), ``refine`` (refiner + prefix surgery + continuation through the rollout engine),
``pairs`` (screen and DPO pair rules), ``stages`` (stage 1, stage 2, evaluation), ``dpo`` (TRL LoRA DPO),
``branches`` + ``grpo`` (stage 3), ``groups`` + ``verl_loop`` (stage 3's branches and judge in verl's agent
loop), ``session`` (experiment dir, judge, MLflow). The flow is
``flows/smartsearch_curriculum.py``. Searches go straight to the retriever; model output is never executed.
"""
