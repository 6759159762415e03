"""Stream text datasets from the Hugging Face hub (for users with internet)."""

from collections.abc import Iterator

from ..errors import UserError
from ..hub import offline_reason


def _offline_error(path: str, reason: str) -> UserError:
    return UserError(
        f"the hub dataset {path!r} cannot be reached ({reason}); offline, train on local files instead: "
        "data=local-text data.path='<file, folder or glob>'"
    )


def iter_documents(sources) -> Iterator[str]:
    """Documents of each configured dataset in turn, streamed (nothing is downloaded whole)."""
    for source in sources:
        if reason := offline_reason():  # decided in 3 s at most, not after half a minute of the client's retries
            raise _offline_error(source.path, reason)
        from datasets import load_dataset  # about 1 s to import: only for a hub source

        try:
            rows = load_dataset(source.path, source.name, split=source.split, streaming=True)
            for row in rows:
                if source.text_field not in row:
                    raise UserError(f"hub dataset {source.path!r} has no field {source.text_field!r} "
                                    f"(fields: {', '.join(row)}); set its text_field")
                text = row[source.text_field]
                if text is not None and not isinstance(text, str):
                    raise UserError(f"hub dataset {source.path!r}: the field {source.text_field!r} holds "
                                    f"{type(text).__name__} values, not text; set its text_field to a text field")
                if text and text.strip():
                    yield text
        except UserError:
            raise
        except Exception as err:  # requests/httpx connection errors, hub errors: all mean "not reachable"
            raise _offline_error(source.path, f"{type(err).__name__}: {str(err).splitlines()[0][:200]}") from None
