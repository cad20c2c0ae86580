"""Where a change goes in the user's code, in their framework's words (hand-built stacks, no framework needed)."""

from __future__ import annotations

import os
import sysconfig

from stallscope.analysis.frameworks import code_site, framework_of, user_frame
from stallscope.settings import in_code

SITE = os.path.join(sysconfig.get_paths()["purelib"])
STDLIB = sysconfig.get_paths()["stdlib"]
USER = "/home/me/project/train.py"

TRAINER_STACK = [f"{SITE}/accelerate/data_loader.py:441:prepare_data_loader",
                 f"{SITE}/transformers/trainer.py:990:get_train_dataloader",
                 f"{SITE}/transformers/trainer.py:2100:_inner_training_loop",
                 f"{SITE}/transformers/trainer.py:2000:train",
                 f"{USER}:88:main", f"{USER}:95:<module>"]
LIGHTNING_STACK = [f"{USER}:40:train_dataloader",
                   f"{SITE}/lightning/pytorch/core/hooks.py:500:_call_lightning_module_hook",
                   f"{SITE}/lightning/pytorch/trainer/trainer.py:580:fit", f"{USER}:70:main"]
PLAIN_STACK = [f"{USER}:30:build_loader", f"{USER}:50:main", f"{STDLIB}/runpy.py:88:_run_code"]


def test_the_framework_and_the_users_frame_are_read_from_the_stack():
    assert framework_of(TRAINER_STACK) == "transformers"
    assert framework_of(LIGHTNING_STACK) == "lightning"
    assert framework_of(PLAIN_STACK) == "pytorch"
    assert framework_of([f"{SITE}/accelerate/data_loader.py:441:prepare", f"{USER}:9:main"]) == "accelerate"
    assert user_frame(TRAINER_STACK) == (f"{USER}:88", "main")
    assert user_frame(LIGHTNING_STACK) == (f"{USER}:40", "train_dataloader")
    assert user_frame([f"{SITE}/x.py:1:f", f"{STDLIB}/runpy.py:2:g"]) is None


def test_the_trainer_change_goes_where_the_script_builds_its_training_arguments():
    args = [{"pid": 7, "framework": "transformers", "t_ns": 100, "site": f"{USER}:61", "values": {}}]
    where = code_site(TRAINER_STACK[0].rsplit(":", 1)[0], TRAINER_STACK, 200, 7, args)
    assert (where.framework, where.site, where.function) == ("transformers", f"{USER}:61", "TrainingArguments")
    assert where.library_site == f"{SITE}/accelerate/data_loader.py:441"
    said = in_code({"num_workers": 2, "persistent_workers": True}, where.to_dict())
    assert said == (f"TrainingArguments(..., dataloader_num_workers=2, dataloader_persistent_workers=True) "
                    f"at {USER}:61")
    # A setting TrainingArguments does not have is said as the DataLoader's.
    assert in_code({"timeout": 30.0}, where.to_dict()).startswith("DataLoader(..., timeout=30.0)")
    # A setting of the training process is said as the call that makes it, before the loader's part.
    assert in_code({"sharing_strategy": "file_system"}, where.to_dict()) == (
        "torch.multiprocessing.set_sharing_strategy('file_system') at the start of training")
    assert in_code({"torch_threads": 3, "num_workers": 5}, where.to_dict()) == (
        f"torch.set_num_threads(3) at the start of training, and TrainingArguments(..., dataloader_num_workers=5) "
        f"at {USER}:61")


def test_lightning_and_plain_changes_name_the_users_dataloader_call():
    lightning = code_site(LIGHTNING_STACK[0].rsplit(":", 1)[0], LIGHTNING_STACK, 0, 1, [])
    assert in_code({"num_workers": 4}, lightning.to_dict()) == \
        f"DataLoader(..., num_workers=4) in train_dataloader() at {USER}:40"
    plain = code_site(f"{USER}:30", PLAIN_STACK, 0, 1, [])
    assert in_code({"pin_memory": True}, plain.to_dict()) == f"DataLoader(..., pin_memory=True) in build_loader() at {USER}:30"
    assert in_code({"num_workers": 1}, None) == "DataLoader(..., num_workers=1)"
    # A session recorded before stacks were: the site alone.
    old = code_site(f"{USER}:30", [f"{USER}:30"], 0, 1, [])
    assert in_code({"num_workers": 1}, old.to_dict()) == f"DataLoader(..., num_workers=1) at {USER}:30"
