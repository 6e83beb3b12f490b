"""``gpuflex audit``: check a ledger offline and show who contributed what.

It reads only the ledger file (and the model blob), never a node, so anyone handed the files
of a finished job can check them. Exit status 0 means every check passed; 1 names the first
bad round and why.
"""

from __future__ import annotations

from pathlib import Path

import typer

from gpuflex.cli.common import JsonOpt, emit_json, fail, short, text

audit_app = typer.Typer(help="Verify a job's ledger offline and show contributions.", no_args_is_help=True)
LedgerArg = typer.Argument(..., help="The ledger file (ledger.msgpack from `gpuflex job results`).")
ModelOpt = typer.Option(None, "--model", help="Model blob (model.blob from `gpuflex job results`).")


@audit_app.command("verify")
def verify(ledger: Path = LedgerArg,
           model: Path | None = ModelOpt,
           json_out: bool = JsonOpt) -> None:
    """Check every signature and hash link; with --model, that the model is a committed round's."""
    from gpuflex.audit import AuditError, verify_ledger

    try:
        report = verify_ledger(ledger, model)
    except AuditError as exc:
        if json_out:
            emit_json({"ok": False, "round": exc.round, "reason": exc.reason})
            raise typer.Exit(1) from None
        fail(str(exc))
    if json_out:
        emit_json(report.to_dict())
        return
    typer.echo(f"ok: job {report.job}, {report.rounds} rounds, every signature and hash link verified")
    if report.model_checked:
        typer.echo(f"ok: model matches round {report.model_round} of {report.rounds} ({report.model_hash[:16]}…)")


@audit_app.command("show")
def show(ledger: Path = LedgerArg, json_out: bool = JsonOpt) -> None:
    """Per round: who contributed with how many samples; then credit (sample-steps) per peer."""
    from gpuflex.audit import AuditError, credit, load_results, round_rows

    try:
        results = load_results(ledger)
    except AuditError as exc:
        fail(str(exc))
    try:
        rows, totals = round_rows(results), credit(results)
    except AuditError as exc:
        fail(str(exc))
    if json_out:
        emit_json({"job": results[-1].job, "rounds": rows, "credit": totals})
        return
    for row in rows:
        acc = row["metrics"].get("accuracy")
        acc_text = f"  accuracy {acc:.3f}" if isinstance(acc, (int, float)) else ""
        rule = row["rule"]["rule"] if isinstance(row["rule"], dict) else (row["rule"] or row["strategy"])
        typer.echo(f"round {row['round']}  coordinator {short(row['coordinator'])}  rule {text(rule, 60)}{acc_text}")
        for c in row["contributors"]:
            typer.echo(f"    {short(c['peer'], 16):>20}  {text(c['samples'], 12):>8} samples")
        if row["absent"]:
            typer.echo(f"    absent: {', '.join(short(p) for p in row['absent'])}")
        for rep in row["secagg"]:
            outcome = "recovered" if rep["recovered"] else f"not recovered: {text(rep['reason'])}"
            dropped = ", ".join(short(p) for p in rep["dropped"]) or "none"
            typer.echo(f"    secure aggregation, group of {short(rep['leader'])} (attempt {rep['attempt']}): "
                       f"{len(rep['survivors'])} masked and present, dropped {dropped}; {outcome}")
    typer.echo("credit (sample-steps accepted)")
    for peer, value in totals.items():
        typer.echo(f"    {text(peer)}  {text(value)}")
