"""The next-call network: a thread's next heap call from its past calls. `training` runs it with no
orchestrator (fit, then score beside the baselines); `model` builds it, `chunks` and `token_data`
cut its inputs, `fitting` fits on whichever backend `backend` chose, `bundle` carries a job to a lent
GPU (`slim_root` cuts the data for it), `hedge` corrects it inside the thread, `headroom` says how far
it could go past the online counter."""
