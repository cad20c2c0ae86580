"""A short DataLoader loop inside the script's own tracker run (MLflow, W&B or a TensorBoard SummaryWriter), so
``stallscope run --log-to ...`` must attach to that run. Prints the run's id for the test to compare."""

import argparse

import torch
from torch.utils.data import DataLoader, TensorDataset


def train(log) -> None:
    data = TensorDataset(torch.randn(96, 16), torch.randint(0, 4, (96,)))
    model = torch.nn.Linear(16, 4)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step, (x, y) in enumerate(DataLoader(data, batch_size=8)):
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        log(step, loss.item())


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--tracker", choices=["mlflow", "wandb", "tensorboard"], required=True)
    p.add_argument("--where", required=True, help="MLflow tracking URI, W&B dir or TensorBoard log dir")
    a = p.parse_args()
    if a.tracker == "mlflow":
        import mlflow

        mlflow.set_tracking_uri(a.where)
        with mlflow.start_run() as run:
            train(lambda step, loss: mlflow.log_metric("loss", loss, step=step) if step % 4 == 0 else None)
        print(f"tracker run {run.info.run_id}", flush=True)
    elif a.tracker == "wandb":
        import wandb

        run = wandb.init(project="tracker-job", dir=a.where, settings=wandb.Settings(console="off"))
        train(lambda step, loss: run.log({"loss": loss}, step=step))
        run.finish()
        print(f"tracker run {run.id}", flush=True)
    else:
        from torch.utils.tensorboard import SummaryWriter

        writer = SummaryWriter(log_dir=a.where)
        train(lambda step, loss: writer.add_scalar("loss", loss, step))
        writer.close()
        print(f"tracker run {writer.log_dir}", flush=True)


if __name__ == "__main__":
    main()
